"""Stopping a real `radixcluster up`: SIGTERM to the command alone (Kubernetes, Docker) drains it,
running requests finish, those that cannot end with an error event, a request still being sent
gets a 503, and no process is left; so
does SIGTERM to all its processes of that command line at once (`pkill -f`); a SIGKILLed command
takes its processes with it. An API key given in the environment never shows in
a command line, and the command prints its URL once ready. (SIGTERM to a TP group's whole process
group, as Ctrl-C sends it: tests/e2e/test_cluster.py, on its tp 3 server.)"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from radixcluster.process_tree import descendants
from support.api_helpers import TIMEOUT_S, assert_error
from support.servers import command_process, free_port, launch_server
from support.streams import finished_normally, sse_stream, started_streams, wait_gone

pytestmark = pytest.mark.slow

KEY = "key-from-the-environment"
ENDLESS_MESSAGE = {
    "model": "any",
    "max_tokens": 4000,
    "messages": [{"role": "user", "content": "Count slowly."}],
    "stream": True,
    "ignore_eos": True,
}


def test_sigterm_to_the_command_drains_then_exits_with_nothing_left():
    # the timeout leaves short requests time to finish on a busy machine; the endless one waits it out
    with launch_server("--shutdown-timeout", "10", api_key=KEY, key_in_env=True) as srv:
        tree = descendants(srv.process.pid)
        for pid in tree | {srv.process.pid}:
            assert KEY not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert_error(requests.get(srv.url + "/v1/models", timeout=TIMEOUT_S), 401)
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            endless = started_streams(srv, pool, [4000])
            short = started_streams(srv, pool, [4, 4, 4])
            message_started = threading.Event()
            endless_message = pool.submit(sse_stream, srv, "/v1/messages", ENDLESS_MESSAGE, message_started)
            assert message_started.wait(TIMEOUT_S)
            half_sent = half_sent_generate(srv)
            srv.process.send_signal(signal.SIGTERM)
            # readiness and new requests see the drain at once; running requests go on
            while requests.get(srv.url + "/health", timeout=TIMEOUT_S).status_code == 200:
                time.sleep(0.05)
            assert_error(requests.get(srv.url + "/health", timeout=TIMEOUT_S), 503, "shutting down")
            refused = requests.post(
                srv.url + "/generate", json={"text": "late"}, headers=srv.headers(), timeout=TIMEOUT_S
            )
            assert_error(refused, 503, "shutting down")
            assert all(finished_normally(f.result()) for f in short)
            # the endless one runs to --shutdown-timeout, then ends with an explicit error
            last = endless[0].result()
            assert last[-1] == "[DONE]" and last[-2]["error"]["code"] == 503
            # and an Anthropic client's, with Anthropic's error event; a new message is refused so too
            stopped = {"type": "error", "error": {"type": "overloaded_error", "message": "the server is shutting down"}}
            assert endless_message.result()[-1] == stopped
            late = requests.post(
                srv.url + "/v1/messages", json=ENDLESS_MESSAGE, headers=srv.headers(), timeout=TIMEOUT_S
            )
            assert late.status_code == 503 and late.json() == stopped
        # the request whose body never came is answered when the server stops, not dropped
        answer = b""
        while chunk := half_sent.recv(65536):
            answer += chunk
        half_sent.close()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"shutting down" in answer
        assert srv.process.wait(timeout=120) == 0
        assert wait_gone(tree, 10) == set()


def half_sent_generate(srv) -> socket.socket:
    """A connection that has sent a /generate request's head and half its body."""
    body = json.dumps({"text": "never finished", "sampling_params": {"max_new_tokens": 4}}).encode()
    head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\ncontent-type: application/json\r\n"
    auth = "".join(f"{name}: {value}\r\n" for name, value in srv.headers().items())
    url = urlsplit(srv.url)
    conn = socket.create_connection((url.hostname, url.port), timeout=120)
    conn.sendall((head + auth + "\r\n").encode() + body[: len(body) // 2])
    return conn


def test_sigterm_to_every_process_of_the_command_line_at_once_is_one_stop():
    # as `pkill -f radixcluster` sends it: to the command and the launcher it forked (which the
    # command's relay reaches too); a second signal ends the drain, but this is one stop
    with launch_server() as srv:
        tree = descendants(srv.process.pid)
        port = srv.url.rsplit(":", 1)[1]
        same_line = [
            pid
            for pid in tree | {srv.process.pid}
            if f"--port\0{port}\0" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        ]
        assert len(same_line) >= 2
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = started_streams(srv, pool, [48, 48])
            for pid in same_line:
                os.kill(pid, signal.SIGTERM)
            assert all(finished_normally(f.result()) for f in running)
        assert srv.process.wait(timeout=120) == 0
        assert wait_gone(tree, 10) == set()


def test_the_url_is_printed_when_ready_and_a_sigkilled_command_takes_its_processes_with_it():
    """At --log-level info: its lines say what it started, in one format."""
    port = free_port()
    argv = ("up", "--port", str(port), "--log-level", "info")
    with command_process(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout.readline().strip() == f"radixcluster ready: http://127.0.0.1:{port}"
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        tree = descendants(process.pid)
        assert len(tree) >= 4  # the launcher, the router, the api, Ray
        process.kill()
        _, err = process.communicate(timeout=90)
    # the seeds' words: SGLang's start-up lines they tell a user to look for
    assert "radix cache enabled (RadixAttention enabled, cache sharing active" in err
    assert "Using RadixAttention backend" in err and "Enable radix cache for prefix sharing" in err
    assert f"Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)" in err
    # every process logs in one format, the api's too (a spawned process configures its own);
    # the launcher's readiness polls log nothing (httpx's line per request stays out)
    assert re.search(
        rf"^\S+ \S+ INFO radixcluster.router.api.server: api serving on http://127.0.0.1:{port}$", err, re.M
    )
    assert "httpx" not in err
    assert wait_gone(tree, 10) == set()
    # nor its sockets and Ray's session: the reaper removes the runtime dirs after the kill
    assert list(Path(tempfile.gettempdir()).glob(f"radixcluster-{process.pid}-*")) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_a_port_taken_while_the_model_loads_ends_the_command_in_one_line():
    port = free_port()
    with command_process("up", "--port", str(port), stderr=subprocess.PIPE) as process:
        assert "radixcluster: serving" in process.stderr.readline()  # past the start's check of the port
        with socket.socket() as taker:
            taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            taker.bind(("127.0.0.1", port))
            taker.listen()
            err = process.stderr.read()
            assert process.wait(timeout=300) == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"radixcluster: error: the api process could not serve --port {port} (taken while the model loaded?)"
    )
