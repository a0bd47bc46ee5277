"""Replica: failed requests open its circuit, a health poll after the cool-down closes it; a
replica that is down loses its view, and once back its error;  its events address names a host the gateway reaches."""

from __future__ import annotations

import time

import numpy as np

from radixcluster.gateway.config import HealthTunables
from radixcluster.gateway.replica import Replica


def test_the_circuit_opens_after_failures_in_a_row_and_a_poll_closes_it_after_the_cooldown() -> None:
    replica = Replica("http://10.0.0.7:30000/", HealthTunables(breaker_failures=2, breaker_cooldown_s=0.2))
    replica.poll_passed()
    assert replica.url == "http://10.0.0.7:30000" and replica.available
    replica.request_failed("ReadError")
    replica.request_passed()  # not in a row
    replica.request_failed("ReadError")
    assert replica.available
    replica.request_failed("HTTP 503")
    assert not replica.available and replica.breaker.is_open
    replica.poll_passed()  # too early: still cooling down
    assert not replica.available and replica.last_error == "HTTP 503"  # why it is out
    time.sleep(0.25)
    replica.poll_passed()
    assert replica.available and replica.last_error is None


def test_a_failed_poll_takes_the_replica_out_and_forgets_its_cache() -> None:
    replica = Replica("http://10.0.0.7:30000", HealthTunables())
    replica.poll_passed()
    replica.view.load_snapshot("i", 3, 16, np.arange(5, dtype=np.uint64))
    replica.poll_failed("ClientConnectorError: refused")
    assert not replica.available and not replica.view.synced and replica.view.cached == set()
    assert replica.describe()["last_error"] == "ClientConnectorError: refused"
    replica.poll_passed()  # it came back: the outage is not its state any more
    assert replica.available and replica.describe()["last_error"] is None


def test_a_slow_poll_keeps_a_busy_replica_in() -> None:
    replica = Replica("http://10.0.0.7:30000", HealthTunables())
    replica.poll_passed()
    replica.poll_slow()  # its router is in a long step
    assert replica.available


def test_a_wildcard_events_host_becomes_the_replicas_own() -> None:
    replica = Replica("http://10.0.0.7:30000", HealthTunables())
    assert replica.events_endpoint("tcp://0.0.0.0:5557") == "tcp://10.0.0.7:5557"
    assert replica.events_endpoint("tcp://*:5557") == "tcp://10.0.0.7:5557"
    assert replica.events_endpoint("tcp://127.0.0.3:41000") == "tcp://127.0.0.3:41000"
