"""A draining uvicorn server says what its drain does: on SIGTERM how many requests get how long,
and when it ends the stragglers, whether the timeout passed or a second signal cut it short."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn

from radixcluster.router.api.draining import DrainingServer


class OneInFlight:
    """A drain with one request that never finishes."""

    draining = False
    failed = False

    def in_flight(self) -> int:
        return 0 if self.failed else 1

    def fail_all(self) -> None:
        self.failed = True


async def _app(scope, receive, send) -> None:
    raise AssertionError("no request reaches it")


def test_sigterm_says_what_the_drain_gives_and_a_second_signal_says_it_cut_it_short(caplog) -> None:
    drain = OneInFlight()
    server = DrainingServer(uvicorn.Config(_app), drain, shutdown_timeout_s=30.0)
    with caplog.at_level(logging.WARNING, "radixcluster.router.api.draining"):
        server.handle_exit(signal.SIGTERM, None)
        assert not asyncio.run(server.on_tick(0)) and drain.draining and not drain.failed
        assert caplog.messages == ["shutting down: new requests get 503; 1 in flight get up to 30 s to finish"]
        server.handle_exit(signal.SIGTERM, None)
        asyncio.run(server.on_tick(1))
    assert drain.failed
    assert caplog.messages[1:] == ["shutdown cut short: ending 1 request(s) with an error"]


def test_the_timeout_names_itself_when_it_ends_the_stragglers(caplog) -> None:
    drain = OneInFlight()
    server = DrainingServer(uvicorn.Config(_app), drain, shutdown_timeout_s=0.0)
    with caplog.at_level(logging.WARNING, "radixcluster.router.api.draining"):
        server.handle_exit(signal.SIGTERM, None)
        asyncio.run(server.on_tick(0))
    assert drain.failed and caplog.messages[-1] == "shutdown timeout (0 s): ending 1 request(s) with an error"
