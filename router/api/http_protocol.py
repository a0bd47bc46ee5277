"""uvicorn's HTTP/1.1 protocol (httptools), guarded against clients that send too much or stop
sending: each request's head is bounded, and a request the client stops sending is answered and
its connection closed. httptools keeps a header's bytes, copying them as they grow, until its
line ends: one client sending an endless header held the whole server's event loop for seconds
and as much memory as it sent; and uvicorn waits for a half-sent request forever, so idle
half-sent requests held a connection each (and, at shutdown, a task uvicorn had to cancel)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from radixcluster.router.api.errors import SHUTTING_DOWN, error_body

# the request line and headers together (nginx allows 32 KiB by default, Node.js 16 KiB)
MAX_HEAD_BYTES = 64 * 1024
HEAD_TOO_LARGE = 431
# how long a connection may go without a byte while its request is unfinished, or before its
# first request (nginx's client_header_timeout and client_body_timeout, 60 s by default)
READ_TIMEOUT_S = 60.0
REQUEST_TIMEOUT = 408
# how long a client may read nothing of an answer the server is writing before its connection
# is closed (nginx's send_timeout, 60 s by default): its request is aborted and its buffered
# answer dropped, instead of a task, a socket and the answer held for as long as it likes
SEND_TIMEOUT_S = 60.0
# after a refusal, what the client still sends is read and dropped this long before the close:
# closing with its bytes unread would reset the connection, and the reset can destroy the answer
LINGER_S = 2.0


class GuardedHttpProtocol(HttpToolsProtocol):
    """Answers 431 and ends the connection once a request's head passes MAX_HEAD_BYTES; 408 once
    the client has sent nothing for ``read_timeout_s`` while a request is unfinished (before the
    first request, the connection is closed then); and 503 to a request still being received
    when the server shuts down."""

    def __init__(
        self, *args: Any, read_timeout_s: float = READ_TIMEOUT_S, send_timeout_s: float = SEND_TIMEOUT_S, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s
        self._unread = _Timer(self.loop, send_timeout_s, self._reader_gone)  # while the client reads nothing
        self._in_head = True  # the next bytes begin a request
        self._head_ended = False  # during one data_received
        self._head_bytes = 0
        self._receiving = False  # a request has begun and not yet ended
        self._stall = _Timer(self.loop, read_timeout_s, self._stalled)  # while a request's bytes are awaited
        self._refused = False
        # a refusal held until the requests before it are answered (HTTP/1.1 answers in order)
        self._held: tuple[int, str] | None = None
        self._running: Any = None  # the request whose app runs (a RequestResponseCycle)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._stall.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stall.stop()
        self._unread.stop()
        running = self._running
        super().connection_lost(exc)
        # uvicorn tells only ``self.cycle``, the newest request: with one pipelined behind it,
        # the request running (a generation) went on for nobody
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True
            running.message_event.set()

    def pause_writing(self) -> None:
        """The transport's buffer is full: the client reads slower than the answer comes."""
        super().pause_writing()
        if not self._unread.pending:
            self._unread.start()

    def resume_writing(self) -> None:
        self._unread.stop()
        super().resume_writing()

    def _reader_gone(self) -> None:
        """Nothing read for send_timeout_s: closed, so the app sees a disconnect."""
        if not self.transport.is_closing():
            self.transport.abort()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        began_in_head, self._head_ended = self._in_head, False
        super().data_received(data)
        if began_in_head and self._in_head and not self._head_ended:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(HEAD_TOO_LARGE, f"the request line and headers are longer than {MAX_HEAD_BYTES} bytes")
                return
        else:
            # only reads that were head from end to end count: one that also held a body
            # (or the end of a head) is a single read, so the bound holds within two reads
            self._head_bytes = 0
        if self._receiving:
            self._stall.start()
        else:
            self._stall.stop()  # the app's turn; uvicorn's keep-alive timeout follows the answer

    def on_message_begin(self) -> None:
        self._receiving = True
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        # httptools reads no URL past 65,535 bytes, whose refusal would be a 400 that blames the
        # framing: one that long passes the head's bound with its request line alone
        if len(self.url) > MAX_HEAD_BYTES - len(b"GET  HTTP/1.1\r\n") and not self._refused:
            self._refuse(HEAD_TOO_LARGE, f"the request line and headers are longer than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self._in_head, self._head_ended = False, True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._receiving = False
        super().on_message_complete()
        self._in_head = True

    def shutdown(self) -> None:
        if self._receiving_body():
            self._refuse(503, SHUTTING_DOWN)
        else:
            super().shutdown()

    def _receiving_body(self) -> bool:
        """Whether the app awaits the rest of a body the client has yet to send."""
        cycle = self.cycle
        return cycle is not None and self._receiving and cycle.more_body and not cycle.response_started

    def _stalled(self) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete and not self._receiving_body()
        if self.flow.read_paused or answering:
            # the wait is ours (the app has not read the body it holds, or still answers an
            # earlier request), not the client's
            self._stall.start()
            return
        if not self._receiving:
            # no request begun: closed without an answer (as nginx and uvicorn's keep-alive close
            # an idle connection), which a client that writes a request on it later cannot take
            # for the answer to that request
            self.transport.close()
            return
        self._refuse(REQUEST_TIMEOUT, f"nothing of the request came for {self.read_timeout_s:g} s")

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to bytes its parser refuses (a bad chunk size, Content-Length beside
        # Transfer-Encoding, an unknown method, HTTP/2's preface) is plain text; every error of
        # this server is JSON
        if not self._refused:
            self._refuse(400, "the request is not valid HTTP/1.1: its head or framing could not be parsed")

    def on_response_complete(self) -> None:
        if self._held is not None and not self.pipeline:
            self._send_refusal(*self._held)
            return
        super().on_response_complete()

    def _refuse(self, status: int, message: str) -> None:
        """Answers ``status`` to the request being received and ends the connection; an app
        waiting for that request's body gets a disconnect, and what it answers is dropped. When
        the bytes refused follow whole requests still being answered, the refusal waits for
        their answers (the bytes after it are read no more)."""
        self._refused = True
        self._stall.stop()
        earlier = self.cycle
        if not self._receiving_body() and earlier is not None and not earlier.response_complete:
            self._held = (status, message)
            return
        self._send_refusal(status, message)

    def _send_refusal(self, status: int, message: str) -> None:
        cycle = self.cycle if self._receiving_body() else None
        path = cycle.scope["path"] if cycle is not None else ""
        body = json.dumps(error_body(status, message, path=path)).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.write(head.encode() + body)
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


class _Timer:
    """One pending call of ``callback`` ``delay_s`` after ``start`` (a new start replaces it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float, callback: Callable[[], None]) -> None:
        self._loop, self._delay_s, self._callback = loop, delay_s, callback
        self._handle: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        self.stop()
        self._handle = self._loop.call_later(self._delay_s, self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()
