"""Placing a request: the predicted cached tokens equal what the replica's real tree would
reuse (pages, salts, the last token, logprob limits, earlier prompts of the same request),
and the choice between replicas follows overlap, load, sessions and availability."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixcluster.block_hash import tenant_salt
from radixcluster.gateway.config import RoutingTunables
from radixcluster.gateway.prompts import Prompt, RoutedRequest
from radixcluster.gateway.routing import Names, NoReplicaAvailable, ReplicaChooser, place
from support.tree_replica import prompt


def request(*prompts: Prompt) -> RoutedRequest:
    return RoutedRequest("native", {}, list(prompts), stream=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cached=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=24), max_size=6),
    asked=st.lists(st.integers(0, 2), min_size=1, max_size=24),
    salt=st.sampled_from([None, "t"]),
)
def test_the_prediction_is_the_trees_own_match(make_replica, cached, asked, salt) -> None:
    r = make_replica(page_size=4)
    for tokens in cached:
        r.insert(tokens, salt if len(tokens) % 2 else None)
    p = prompt(asked, salt)
    (predicted,) = place(r.replica, [p], Names([p])).predicted
    assert predicted == r.cached(asked, salt)


def test_a_logprob_start_bounds_the_prediction_like_the_router(make_replica) -> None:
    r = make_replica(page_size=4)
    r.insert(list(range(40)))
    p = prompt(list(range(40)) + [7], logprob_start_len=10)
    assert place(r.replica, [p], Names([p])).predicted == [8]


def test_earlier_prompts_of_a_request_count_as_pending(make_replica) -> None:
    r = make_replica(page_size=4)
    same = prompt(list(range(30)))
    prompts = [same, same, prompt(list(range(12)) + [50] * 10)]
    assert place(r.replica, prompts, Names(prompts)).predicted == [0, 28, 12]


def test_cache_aware_choice_follows_the_prefix_unless_the_load_outweighs_it(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    shared = list(range(100))
    a.insert(shared)
    chooser = ReplicaChooser(RoutingTunables(load_weight=0.5))
    asked = request(prompt(shared + [1, 2, 3]))
    assert chooser.choose(asked, [a.replica, b.replica], None, set()).replica is a.replica
    a.replica.load.inflight_tokens = 150  # 100 cached tokens < 0.5 x 150 more queued: still a
    assert chooser.choose(asked, [a.replica, b.replica], None, set()).replica is a.replica
    a.replica.load.inflight_tokens = 250
    assert chooser.choose(asked, [a.replica, b.replica], None, set()).replica is b.replica


def test_little_overlap_goes_to_the_least_loaded_replica_and_ties_take_turns(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    a.insert(list(range(8)))
    chooser = ReplicaChooser(RoutingTunables(min_overlap=0.25))
    asked = request(prompt(list(range(8)) + [60] * 92))  # 8 of 99 usable tokens cached on a
    b.replica.load.inflight_tokens = 10
    assert chooser.choose(asked, [a.replica, b.replica], None, set()).replica is a.replica
    a.replica.load.inflight_tokens = 20
    assert chooser.choose(asked, [a.replica, b.replica], None, set()).replica is b.replica
    fresh = request(prompt([70] * 50))
    a.replica.load.inflight_tokens = b.replica.load.inflight_tokens = 0
    picked = {chooser.choose(fresh, [a.replica, b.replica], None, set()).replica.url for _ in range(4)}
    assert picked == {"http://a", "http://b"}


def test_round_robin_ignores_the_cache(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    a.insert(list(range(40)))
    chooser = ReplicaChooser(RoutingTunables(policy="round-robin"))
    asked = request(prompt(list(range(41))))
    placed = [chooser.choose(asked, [a.replica, b.replica], None, set()) for _ in range(4)]
    assert [p.replica.url for p in placed] == ["http://a", "http://b", "http://a", "http://b"]
    assert [p.predicted for p in placed] == [[40], [0], [40], [0]]  # predictions are still made


def test_a_session_stays_on_its_replica_while_it_is_available(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    b.insert(list(range(40)))
    chooser = ReplicaChooser(RoutingTunables())
    first = chooser.choose(request(prompt([5] * 40)), [a.replica, b.replica], "run-1", set())
    other = b if first.replica is a.replica else a
    # the other replica holds this prompt's prefix, yet the session stays
    other.insert(list(range(60)))
    again = chooser.choose(request(prompt(list(range(61)))), [a.replica, b.replica], "run-1", set())
    assert again.replica is first.replica
    first.replica.healthy = False
    moved = chooser.choose(request(prompt(list(range(61)))), [a.replica, b.replica], "run-1", set())
    assert moved.replica is other.replica


def test_tried_and_unavailable_replicas_are_skipped(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    chooser = ReplicaChooser(RoutingTunables())
    asked = request(prompt([1] * 10))
    assert chooser.choose(asked, [a.replica, b.replica], None, {a.replica}).replica is b.replica
    b.replica.breaker.failure(0.0)
    b.replica.breaker.failure(0.0)
    b.replica.breaker.failure(0.0)  # three failed requests in a row open its circuit
    with pytest.raises(NoReplicaAvailable, match="tried 1"):
        chooser.choose(asked, [a.replica, b.replica], None, {a.replica})


def test_a_tenants_prefix_draws_that_tenants_requests_only(make_replica) -> None:
    a, b = make_replica("http://a"), make_replica("http://b")
    shared = list(range(100))
    a.insert(shared, tenant_salt("alpha", None))
    alpha, beta = (prompt(shared + [1], tenant_salt(t, None)) for t in ("alpha", "beta"))
    assert place(a.replica, [alpha], Names([alpha])).predicted == [a.cached(shared + [1], alpha.salt)] == [100]
    assert place(a.replica, [beta], Names([beta])).predicted == [0] == [a.cached(shared + [1], beta.salt)]
    chooser = ReplicaChooser(RoutingTunables())
    assert chooser.choose(request(alpha), [a.replica, b.replica], None, set()).replica is a.replica
    b.replica.load.inflight_tokens = 1  # beta finds nothing anywhere: the least loaded replica
    assert chooser.choose(request(beta), [a.replica, b.replica], None, set()).replica is a.replica
