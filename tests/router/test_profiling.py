"""The router's side of /start_profile and /stop_profile: one profile at a time, the messages
owed to the ranks in order, a profile of num_steps steps that stops by itself, and a lost TP
group that ends the profile it was recording."""

from __future__ import annotations

import pytest

from radixcluster.protocol import MAX_PROFILE_STEPS, Profile, decode, encode
from radixcluster.router.profiling import ProfileControl, ProfileRefused

ARGS = {
    "output_dir": "/traces",
    "profile_id": "17",
    "prefix": "p-",
    "activities": ["CPU"],
    "with_stack": True,
    "record_shapes": False,
}


def test_a_profile_starts_and_stops_once_and_names_each_ranks_trace():
    control = ProfileControl(tp_size=3)
    files = [f"/traces/p-17-TP-{rank}.trace.json.gz" for rank in range(3)]
    assert control.start(ARGS) == {"trace_files": files}
    with pytest.raises(ProfileRefused, match="already running"):
        control.start(ARGS)
    assert control.stop() == {"trace_files": files}
    with pytest.raises(ProfileRefused, match="no profile is running"):
        control.stop()
    sent = [decode(encode(msg)) for msg in control.take()]  # as the ranks read them
    assert [m.start for m in sent] == [True, False]
    assert (sent[0].output_dir, sent[0].activities, sent[0].with_stack) == ("/traces", ["CPU"], True)
    assert control.take() == []


def test_num_steps_stops_after_the_last_of_them():
    control = ProfileControl(tp_size=1)
    control.start({**ARGS, "num_steps": 2})
    control.stepped()
    assert [m.start for m in control.take()] == [True]
    control.stepped()
    assert control.take() == [Profile(start=False)]
    control.stepped()  # no profile: nothing more
    assert control.take() == []
    control.start(ARGS)  # a new one may start, until /stop_profile
    for _ in range(MAX_PROFILE_STEPS - 1):
        control.stepped()
    assert [m.start for m in control.take()] == [True]
    control.stepped()  # or its events would grow the rank for ever
    assert control.take() == [Profile(start=False)]


def test_a_lost_group_ends_its_profile_and_what_was_owed_to_it():
    control = ProfileControl(tp_size=1)
    control.start(ARGS)
    control.group_lost()
    assert control.take() == []
    with pytest.raises(ProfileRefused, match="no profile is running"):
        control.stop()
    control.start(ARGS)
    assert len(control.take()) == 1
