"""uvicorn's HTTP/1.1 protocol (httptools) with each request's head bounded. httptools keeps a
header's bytes, copying them as they grow, until its line ends: one client sending an endless
header held the whole server's event loop for seconds and as much memory as it sent."""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from radixcluster.router.api.errors import error_body

# the request line and headers together (nginx allows 32 KiB by default, Node.js 16 KiB)
MAX_HEAD_BYTES = 64 * 1024
HEAD_TOO_LARGE = 431
# after a 431, what the client still sends is read and dropped this long before the close:
# closing with its bytes unread would reset the connection, and the reset can destroy the 431
LINGER_S = 2.0


class BoundedHeadProtocol(HttpToolsProtocol):
    """Answers 431 and ends the connection once a request's head passes MAX_HEAD_BYTES."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes begin a request
        self._head_ended = False  # during one data_received
        self._head_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        began_in_head, self._head_ended = self._in_head, False
        super().data_received(data)
        if began_in_head and self._in_head and not self._head_ended:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse()
        else:
            # only reads that were head from end to end count: one that also held a body
            # (or the end of a head) is a single read, so the bound holds within two reads
            self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head, self._head_ended = False, True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True

    def _refuse(self) -> None:
        message = f"the request line and headers are longer than {MAX_HEAD_BYTES} bytes"
        body = json.dumps(error_body(HEAD_TOO_LARGE, message)).encode()
        head = (
            f"HTTP/1.1 {HEAD_TOO_LARGE} Request Header Fields Too Large\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self._refused = True
        self.transport.write(head.encode() + body)
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
