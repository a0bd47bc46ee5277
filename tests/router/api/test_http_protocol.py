"""The guarded HTTP protocol, on a real uvicorn server over real sockets: an endless header or
URL gets a 431 and a closed connection, while heads under the bound, bodies of any size in
the same reads and pipelined requests are served as before; a request the client stops sending
gets a 408 once the read timeout passes without a byte (a connection that sends none is closed), while
slow but steady clients and slow answers are served; and a request still being received at
shutdown gets a 503, its app a disconnect rather than a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from radixcluster.router.api.errors import SHUTTING_DOWN
from radixcluster.router.api.http_protocol import MAX_HEAD_BYTES, GuardedHttpProtocol

TIMEOUT_S = 30
READ_TIMEOUT_S = 0.5
# /slow answers after this long: longer than the read timeout, which must not cut it
SLOW_APP_S = 3 * READ_TIMEOUT_S
FLOOD_CHUNK, FLOOD_CHUNKS = 1 << 20, 256  # /flood's answer: 256 MiB
# paths whose app saw the client's disconnect instead of the whole body
disconnects: list[str] = []


async def body_length(scope, receive, send) -> None:
    """Answers each request with the length of its body (/slow: after SLOW_APP_S)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_APP_S)
    if scope["path"] == "/flood":  # a long answer, written as fast as the transport takes it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(FLOOD_CHUNKS):
            await send({"type": "http.response.body", "body": b"x" * FLOOD_CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/hold":  # never answers: waits for the client to leave
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnects.append(scope["path"])
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnects.append(scope["path"])
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(protocol) -> Iterator[tuple[uvicorn.Server, tuple[str, int]]]:
    """A uvicorn server of body_length on ``protocol``, on a free port, in a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(body_length, http=protocol, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield server, listener.getsockname()
    server.should_exit = True
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    with serving(GuardedHttpProtocol) as (_, address):
        yield address


@pytest.fixture(scope="module")
def impatient() -> Iterator[tuple[str, int]]:
    """A server whose read and send timeouts are READ_TIMEOUT_S."""
    protocol = functools.partial(GuardedHttpProtocol, read_timeout_s=READ_TIMEOUT_S, send_timeout_s=READ_TIMEOUT_S)
    with serving(protocol) as (_, address):
        yield address


def exchange(address: tuple[str, int], pieces: list[bytes], pause_s: float = 0.0) -> bytes:
    """Sends ``pieces`` one by one, ``pause_s`` apart, and reads until the server ends the connection."""
    with socket.create_connection(address, timeout=TIMEOUT_S) as conn:
        try:
            for i, piece in enumerate(pieces):
                if i:
                    time.sleep(pause_s)
                conn.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-head: the answer is already on its way
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def get(header: bytes = b"", last: bool = True) -> bytes:
    """A request; the server closes the connection after answering the ``last`` one."""
    return b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if last else b"") + header + b"\r\n"


def post(body: bytes, last: bool = True, path: bytes = b"/") -> bytes:
    close = b"Connection: close\r\n" if last else b""
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: x\r\n"
        + close
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def test_a_client_that_leaves_with_a_request_pipelined_is_seen_to_leave(address) -> None:
    """uvicorn tells only the queued request of the disconnect: the one running (a generation)
    went on for nobody, and its late answer raised on the closed transport."""
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.2)
    deadline = time.monotonic() + TIMEOUT_S
    while "/hold" not in disconnects:
        assert time.monotonic() < deadline, "the running request never saw its client leave"
        time.sleep(0.01)


def test_a_client_that_reads_nothing_of_an_answer_is_closed_after_the_send_timeout(impatient) -> None:
    """Its socket, task and buffered answer were held for as long as it liked."""
    with socket.create_connection(impatient, timeout=TIMEOUT_S) as sock:
        sock.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(4 * READ_TIMEOUT_S)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
    assert 0 < received < FLOOD_CHUNK * FLOOD_CHUNKS  # what the buffers held, then the close


def test_a_small_request_is_served(address) -> None:
    assert exchange(address, [post(b"hello")]).startswith(b"HTTP/1.1 200")


def test_an_endless_header_gets_a_431_and_the_connection_closes(address) -> None:
    # sent in small reads, as a slow client would: each read of it counts
    pieces = [get().removesuffix(b"\r\n") + b"X-Big: "] + [b"a" * 4096] * (4 * MAX_HEAD_BYTES // 4096)
    answer = exchange(address, pieces)
    assert answer.startswith(b"HTTP/1.1 431 ")
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == 431 and str(MAX_HEAD_BYTES) in body["error"]["message"]
    assert exchange(address, [get()]).startswith(b"HTTP/1.1 200")


def test_an_endless_url_gets_a_431(address) -> None:
    assert exchange(address, [b"GET /" + b"a" * (2 * MAX_HEAD_BYTES)]).startswith(b"HTTP/1.1 431 ")


def test_a_whole_request_line_past_the_bound_gets_a_431(address) -> None:
    # complete, so the parser reads it whole; httptools takes no URL past 65,535 bytes
    line = b"GET /?x=" + b"a" * (MAX_HEAD_BYTES + 500) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert str(MAX_HEAD_BYTES) in error_of(exchange(address, [line]), 431)


def test_a_head_under_the_bound_is_served(address) -> None:
    header = b"X-Big: " + b"a" * (MAX_HEAD_BYTES - 1024) + b"\r\n"
    assert exchange(address, [get(header=header)]).startswith(b"HTTP/1.1 200")


def test_bodies_and_pipelined_requests_do_not_count_as_head(address) -> None:
    # one write: a body four times the bound, then a second request whose head is cut short
    # and finished in a later read
    second = get(header=b"X-Small: " + b"a" * 1000 + b"\r\n")
    answer = exchange(address, [post(b"b" * (4 * MAX_HEAD_BYTES), last=False) + second[:20], second[20:]])
    assert answer.count(b"HTTP/1.1 200") == 2 and str(4 * MAX_HEAD_BYTES).encode() in answer


def error_of(answer: bytes, status: int) -> str:
    """The message of an answer that must be a JSON error of ``status``."""
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == status
    return body["error"]["message"]


@pytest.mark.parametrize("path", [b"/", b"/slow"])
def test_requests_before_refused_bytes_are_answered_first(address, path: bytes) -> None:
    # HTTP/1.1 answers in order: the whole requests sent before the bytes the parser refuses get
    # their answers, then the refusal closes the connection
    answer = exchange(address, [post(b"hello", last=False, path=path) + get(last=False) + b"GARBAGE\r\n\r\n"])
    first, second, refusal = answer.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200") and first.endswith(b"5") and second.startswith(b"200")
    assert "not valid HTTP/1.1" in error_of(b"HTTP/1.1 " + refusal, 400)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n",  # no such method
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2's preface
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["method", "http2", "chunk size", "length and chunks"],
)
def test_bytes_the_parser_refuses_get_a_json_400(address, request_bytes: bytes) -> None:
    """uvicorn answers them in plain text; every error of the server is JSON."""
    assert "not valid HTTP/1.1" in error_of(exchange(address, [request_bytes]), 400)


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(impatient) -> None:
    started = time.monotonic()
    assert exchange(impatient, []) == b""
    # uvloop's timers count from the loop's cached clock (milliseconds, read at the start of the
    # iteration), so the close may come a few milliseconds before READ_TIMEOUT_S of real time
    assert READ_TIMEOUT_S - 0.05 <= time.monotonic() - started < TIMEOUT_S


def test_a_head_the_client_stops_sending_gets_a_408(impatient) -> None:
    message = error_of(exchange(impatient, [b"POST / HTTP/1.1\r\nHost: x\r\n"]), 408)
    assert message == "nothing of the request came for 0.5 s"


def test_a_body_the_client_stops_sending_gets_a_408_and_its_app_a_disconnect(impatient) -> None:
    request = post(b"x" * 100, path=b"/stalled")
    error_of(exchange(impatient, [request[:-50]]), 408)
    # the app's task sees the disconnect on the server's loop, maybe after the client saw the 408
    deadline = time.monotonic() + TIMEOUT_S
    while "/stalled" not in disconnects:
        assert time.monotonic() < deadline, "the app never saw the disconnect"
        time.sleep(0.01)
    assert exchange(impatient, [post(b"hello")]).endswith(b"\r\n\r\n5")


def test_a_slow_but_steady_client_is_served(impatient) -> None:
    # each piece within the timeout, the whole request over three times it
    request = post(b"y" * 300)
    pieces = [request[i : i + 30] for i in range(0, len(request), 30)]
    answer = exchange(impatient, pieces, pause_s=READ_TIMEOUT_S / 3)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n300")


def test_a_slow_answer_is_not_a_stalled_client(impatient) -> None:
    # the first answer takes three timeouts while the second request waits, whole, behind it
    answer = exchange(impatient, [post(b"abc", last=False, path=b"/slow") + post(b"de")])
    assert answer.count(b"HTTP/1.1 200") == 2 and answer.endswith(b"\r\n\r\n2")


def test_a_stalled_request_behind_a_slow_answer_waits_for_it(impatient) -> None:
    # the second request's head is cut short: the 408 comes after the first answer, not into it
    answer = exchange(impatient, [post(b"abc", last=False, path=b"/slow") + b"POST / HTTP/1.1\r\n"])
    first, second = answer.split(b"HTTP/1.1 408 ")
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\n3")
    assert b'"code": 408' in second


def test_a_body_still_being_received_at_shutdown_gets_a_503(caplog) -> None:
    caplog.set_level(logging.ERROR)
    with contextlib.ExitStack() as stack:
        server, address = stack.enter_context(serving(GuardedHttpProtocol))
        conn = stack.enter_context(socket.create_connection(address, timeout=TIMEOUT_S))
        conn.sendall(post(b"z" * 100, path=b"/draining")[:-10])
        deadline = time.monotonic() + TIMEOUT_S
        while not server.server_state.tasks:
            assert time.monotonic() < deadline, "the request never reached the app"
            time.sleep(0.01)
        server.should_exit = True
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert error_of(answer, 503) == SHUTTING_DOWN
    assert "/draining" in disconnects
    assert "Exception in ASGI application" not in caplog.text
