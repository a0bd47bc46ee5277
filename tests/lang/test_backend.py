"""RuntimeEndpoint failures that need no server: a refused connection names the address."""

from __future__ import annotations

import socket

import pytest

import radixcluster.lang as sgl


def test_unreachable_server_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The port was bound and released: nothing listens there now.
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}/get_server_info"):
        sgl.RuntimeEndpoint(f"http://127.0.0.1:{port}")


def test_run_without_backend_says_how_to_give_one():
    @sgl.function
    def nothing(s):
        s += "x"

    with pytest.raises(RuntimeError, match="set_default_backend"):
        nothing.run()
