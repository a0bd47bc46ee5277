"""The restart budget and the counters of the router's view of its TP group."""

from __future__ import annotations

from radixcluster.router.group_health import GroupHealth


def test_the_budget_counts_losses_in_a_row_and_a_completed_step_resets_it():
    health = GroupHealth(max_restarts=2)
    assert health.lose(0, "rank 0 failed in step 2")
    assert health.lose(1, "rank 1 died while loading")  # the replacement never served
    assert not health.lose(1, "rank 1 died while loading") and not health.budget_spent
    assert health.stats()["group_down_reason"] == "rank 1 died while loading"
    health.restored(2)
    health.stepped()  # group 2 served a step: the crash loop, if it was one, ended
    assert health.lose(2, "rank 0 died") and not health.budget_spent
    health.restored(3)
    assert health.lose(3, "rank 0 died") and not health.budget_spent
    health.restored(4)
    assert health.lose(4, "rank 0 died") and health.budget_spent  # three in a row, budget two
    stats = health.stats()
    assert (stats["worker_restarts_total"], stats["group_up"], stats["group_down_reason"]) == (3, 0, "rank 0 died")


def test_a_report_about_a_replaced_or_already_lost_group_is_ignored_but_names_the_loss():
    health = GroupHealth(max_restarts=3)
    assert health.lose(0, "rank 1 failed in step 3: Connection closed by peer")
    # the launcher's word on the same loss: not a second loss, but it names the rank that died
    assert not health.lose(0, "rank 2 died; rank 1 failed in step 3: Connection closed by peer")
    assert health.down_reason.startswith("rank 2 died") and health.losses_in_a_row == 1
    health.restored(1)
    assert not health.lose(0, "rank 2 died")  # about group 0, which is gone
    assert health.up and health.losses_in_a_row == 1
