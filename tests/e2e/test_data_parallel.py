"""`radixcluster up --dp-size 2` (with an API key, an admin key and two tenants' keys): two
replicas behind the cache-aware gateway keep each tenant's prefix on one replica (near the reuse
of one big cache, where round-robin spreads it), predict the cached tokens they report, survive a
replica killed under load, see a flush, keep a session on one replica, pass SGLang's other
endpoints on, and serve the cache-control calls and the tenants as one replica would."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
import requests

import radixcluster.lang as sgl
from radixcluster.bench.report import format_table
from radixcluster.process_tree import descendants
from support.api_helpers import get, metric_value, post
from support.cache_page import page_nodes
from support.profiles import wait_for_traces
from support.servers import (
    ServerHandle,
    command_process,
    free_port,
    launch_server,
    radixcluster_command,
    wait_replicas,
)
from support.streams import wait_gone

pytestmark = pytest.mark.slow

# small pages and pool, short prompts and answers: the machine is two shared cores
DP_FLAGS = ("--dp-size", "2", "--page-size", "16", "--max-total-tokens", "4096")
TENANTS, PER_TENANT, PREFIX, QUESTION, OUTPUT = 8, 4, 96, 16, 2
LONG_REQUEST_S = 600  # a replica's requests, rerun on the other after it dies, on a loaded machine
# requests the kill test keeps in flight until both replicas run one: at least the first, at
# most the second
MIN_UNDER_LOAD, MAX_UNDER_LOAD = 4, 12
API_KEY, ADMIN_KEY = "dp-api-key", "dp-admin-key"
TENANT_KEYS = {"dp-alpha-key": "alpha", "dp-beta-key": "beta"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({key: {"tenant": name} for key, name in TENANT_KEYS.items()}))
    admin = {"RADIXCLUSTER_ADMIN_API_KEY": ADMIN_KEY}
    with launch_server(*DP_FLAGS, "--api-key-file", str(keys), api_key=API_KEY, key_in_env=True, env=admin) as handle:
        wait_replicas(handle, 2)
        yield handle


def replicas(server: ServerHandle) -> dict[str, dict]:
    return {r["url"]: r for r in get(server, "/replicas").json()["replicas"]}


def wait_for(what: str, check, timeout: float = 300, state=None) -> None:
    """Poll ``check`` until it holds; a timeout says what ``state()`` (if given) shows then."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}" + (f": {state()}" if state else "")
        time.sleep(0.5)


def bench(server: ServerHandle, label: str, out: Path) -> dict:
    """The interleaved multi-tenant workload through ``server``; its JSON summary."""
    cmd = [
        *radixcluster_command(),
        "bench",
        "--base-url",
        server.url,
        "--workload",
        "multi-tenant",
        "--groups",
        str(TENANTS),
        "--requests-per-group",
        str(PER_TENANT),
        "--prefix-len",
        str(PREFIX),
        "--question-len",
        str(QUESTION),
        "--output-len",
        str(OUTPUT),
        "--label",
        label,
        "--no-progress",
        "--output-json",
        str(out),
        "--api-key",
        API_KEY,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_a_replica_that_refuses_its_flags_ends_the_command_with_its_reason() -> None:
    """The replicas read the model path: what they refuse is said by the command, not by a Ray
    traceback that hides it in the actor's log."""
    cmd = [*radixcluster_command(), "up", "--dp-size", "2", "--port", str(free_port()), "--load-format", "safetensors"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("radixcluster: error: replica http://127.0.0.1:")
    assert "exited with 2 while starting: radixcluster: error: --load-format safetensors: the model path" in last


def test_sigterm_while_the_replicas_start_stops_the_command_quietly() -> None:
    """The replicas' start calls that the stop cuts short leave no Ray "Unhandled error"
    tracebacks; the command exits 0 with nothing left."""
    argv = ("up", "--dp-size", "2", "--port", str(free_port()), "--max-total-tokens", "2000")
    with command_process(*argv, stderr=subprocess.PIPE) as process:
        loading = 0
        while loading < 2:  # both replicas say what they serve, then load it
            line = process.stderr.readline()
            assert line, "the command ended before its replicas started"
            loading += "radixcluster: serving" in line
        tree = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=120) == 0
    assert "Unhandled error" not in rest and "Traceback" not in rest, rest
    assert wait_gone(tree, 30) == set()


def test_tenants_stay_on_one_replica_and_their_cached_tokens_are_predicted(cluster, tmp_path) -> None:
    aware = bench(cluster, "cache-aware gateway", tmp_path / "aware.json")
    s = aware["summary"]
    assert s["errors"] == 0 and len(s["replicas"]) == 2, s
    # the ideal is one cache that holds all (a replica with both pools); it bounds what one gets
    assert s["cached_ratio"] >= 0.95 * s["ideal_cached_ratio"], s
    assert s["predicted_exact_ratio"] >= 0.95, [
        (r["predicted_cached_tokens"], r["cached_tokens"]) for r in aware["requests"]
    ]
    urls = [f"--replica={url}" for url in replicas(cluster)]
    with launch_server(*urls, "--policy", "round-robin", command="gateway", api_key=API_KEY) as spread_gateway:
        wait_replicas(spread_gateway, 2)
        spread = bench(spread_gateway, "round-robin gateway", tmp_path / "spread.json")
    print("\n" + format_table([aware, spread]))
    assert spread["summary"]["errors"] == 0
    assert spread["summary"]["cached_ratio"] < s["cached_ratio"]


def test_a_flushed_replica_vanishes_from_the_view(cluster) -> None:
    for i in range(4):  # distinct prefixes: both replicas get some
        body = {"text": f"Tenant {i}: " + "a long shared system prompt " * 12, "sampling_params": {"max_new_tokens": 1}}
        assert post(cluster, "/generate", body).status_code == 200
    held = {url: r for url, r in replicas(cluster).items() if r["cached_tokens"] > 0}
    assert len(held) == 2, replicas(cluster)
    flushed, kept = list(held)
    flushing = requests.post(f"{flushed}/flush_cache", headers=cluster.headers(), timeout=60)
    assert flushing.status_code == 200  # behind the gateway's back
    wait_for("the flushed replica's blocks leave the view", lambda: replicas(cluster)[flushed]["cached_tokens"] == 0)
    assert replicas(cluster)[kept]["cached_tokens"] == held[kept]["cached_tokens"]


def test_sglang_endpoints_answer_through_the_gateway(cluster) -> None:
    """Model information and tokenizing come from any replica; an abort reaches the replica
    that runs the request; bad bodies get the replicas' own 400s."""
    info = get(cluster, "/model_info").json()
    assert info["model_path"].endswith(".gguf") and get(cluster, "/get_model_info").json() == info
    assert get(cluster, "/weight_version").json() == {"weight_version": info["weight_version"]}
    gateway = get(cluster, "/server_info").json()["gateway"]
    assert gateway["policy"] == "cache-aware" and sorted(gateway["replicas"]) == sorted(replicas(cluster))
    model = get(cluster, "/v1/models").json()["data"][0]["id"]
    assert get(cluster, f"/v1/models/{model}").json()["id"] == model
    assert get(cluster, "/v1/models/not-this-one").status_code == 404
    one = post(cluster, "/tokenize", {"prompt": "Hello, world"}).json()
    assert one["count"] == len(one["tokens"]) > 0
    assert post(cluster, "/v1/detokenize", {"tokens": one["tokens"]}).json()["text"] == "Hello, world"
    assert "vocabulary" in post(cluster, "/detokenize", {"tokens": [10**6]}).text
    loads = get(cluster, "/get_load").json()  # SGLang's, one entry per replica as per DP rank
    assert [entry["dp_rank"] for entry in loads] == [0, 1] and all(entry["num_reqs"] == 0 for entry in loads)
    text = {"text": "<think>Hmm.</think>Yes.", "reasoning_parser": "qwen3"}
    assert post(cluster, "/separate_reasoning", text).json() == {"reasoning_text": "Hmm.", "text": "Yes."}
    body = {"text": "Count slowly:", "rid": "abort-me", "stream": True}
    body["sampling_params"] = {"max_new_tokens": 400, "ignore_eos": True}
    with requests.post(
        f"{cluster.url}/generate", json=body, headers=cluster.headers(), stream=True, timeout=LONG_REQUEST_S
    ) as resp:
        frames = (line[6:] for line in resp.iter_lines() if line.startswith(b"data: "))
        next(frames)  # it runs
        assert post(cluster, "/abort_request", {"rid": "abort-me"}).status_code == 200
        events = list(frames)
    assert events[-1] == b"[DONE]"
    last = json.loads(events[-2])["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and last["completion_tokens"] < 400
    refused = post(cluster, "/abort_request", {})
    assert refused.status_code == 400 and "rid" in refused.text


def test_the_gateway_profiles_every_replica_under_one_id_apart(cluster, tmp_path) -> None:
    """The admin's key goes on to the replicas, each of which writes its traces named by its
    index in GET /replicas (SGLang's DP-{rank})."""
    admin_key = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"output_dir": str(tmp_path), "profile_id": "dp"}
    assert "admin key" in post(cluster, "/start_profile", body).text  # the API key is not enough
    started = requests.post(cluster.url + "/start_profile", json=body, headers=admin_key, timeout=120)
    assert (started.status_code, started.text) == (200, "Start profiling.\n")
    for i in range(2):
        post(cluster, "/generate", {"text": f"Profiled on replica {i}?", "sampling_params": {"max_new_tokens": 2}})
    assert requests.post(cluster.url + "/stop_profile", headers=admin_key, timeout=120).status_code == 200
    traces = wait_for_traces(tmp_path, "DP-*-dp-TP-0.trace.json.gz", 2)
    assert [t.name for t in traces] == ["DP-0-dp-TP-0.trace.json.gz", "DP-1-dp-TP-0.trace.json.gz"]
    stopped_twice = requests.post(cluster.url + "/stop_profile", headers=admin_key, timeout=120)
    assert stopped_twice.status_code == 400 and "no profile is running" in stopped_twice.text


def replica_group(server: ServerHandle, url: str) -> int:
    """The process group of the replica serving ``url`` (its `radixcluster up`, router, api)."""
    port = url.rsplit(":", 1)[1]
    for pid in descendants(server.process.pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"up" in args and b"--port" in args and args[args.index(b"--port") + 1] == port.encode():
            return os.getpgid(pid)
    raise AssertionError(f"no replica process serves {url}")


def test_a_replica_killed_under_load_is_routed_around_and_rejoins(cluster) -> None:
    before = replicas(cluster)
    victim, survivor = list(before)

    def ask(text: str, new_tokens: int = 48) -> requests.Response:
        # long enough to be running when the replica dies, even on a fast machine
        body = {"text": text, "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True}}
        return requests.post(f"{cluster.url}/generate", json=body, headers=cluster.headers(), timeout=LONG_REQUEST_S)

    with concurrent.futures.ThreadPoolExecutor(MAX_UNDER_LOAD + 1) as pool:
        answers: list[concurrent.futures.Future] = []
        next_at = time.monotonic()

        def both_run_requests() -> bool:
            # the gateway places by load, and a replica whose health polls time out on a loaded
            # machine is out for a while: a request that finishes is replaced at once (one at a
            # time went to whichever replica was idle, and the two never ran together), and one
            # more joins every few seconds, until both run one
            nonlocal next_at
            if all(r["inflight_requests"] for r in replicas(cluster).values()):
                return True
            running = sum(not a.done() for a in answers)
            fresh = max(MIN_UNDER_LOAD - running, 0)
            if not fresh and running < MAX_UNDER_LOAD and time.monotonic() >= next_at:
                fresh, next_at = 1, time.monotonic() + 5
            for i in range(len(answers), len(answers) + fresh):
                answers.append(pool.submit(ask, f"Request {i} of a batch under load: " + "tell a long story " * 8))
            return False

        def placements() -> str:
            fields = ("available", "healthy", "circuit_open", "last_error", "inflight_requests", "requests_total")
            now = {url: {f: r.get(f) for f in fields} for url, r in replicas(cluster).items()}
            return f"{len(answers)} sent, {sum(a.done() for a in answers)} done; replicas {now}"

        wait_for("both replicas run requests", both_run_requests, state=placements)
        os.killpg(replica_group(cluster, victim), signal.SIGKILL)
        # a health poll (every second) sees it gone long before its restart has loaded the model
        wait_for(
            "the killed replica is out with its blocks dropped",
            lambda: not replicas(cluster)[victim]["available"] and replicas(cluster)[victim]["cached_tokens"] == 0,
            timeout=60,
        )
        later = pool.submit(ask, "After the crash: " + "another story " * 8, 1)
        results = [a.result() for a in answers]
    # those that were running on the victim when it died had sent nothing yet: they ran again
    assert [r.status_code for r in results] == [200] * len(answers), [r.text for r in results]
    assert metric_value(cluster, f'radixcluster_gateway_retries_total{{replica="{victim}"}}') >= 1
    assert later.result().json()["meta_info"]["replica"] == survivor
    wait_for(
        "the restarted replica is back in step",
        lambda: replicas(cluster)[victim]["synced"] and replicas(cluster)[victim]["available"],
        timeout=600,
    )
    assert replicas(cluster)[victim]["instance"] != before[victim]["instance"]
    served = {
        ask(f"Tenant {i} after the restart: " + "words " * 20, 1).json()["meta_info"]["replica"] for i in range(4)
    }
    assert served == {victim, survivor}


def test_a_session_stays_on_one_replica(cluster) -> None:
    served = set()
    for i in range(3):
        body = {"text": f"Unrelated prompt number {i} " * 6, "sampling_params": {"max_new_tokens": 1}}
        headers = {**cluster.headers(), "X-Session-Id": "one-run"}
        resp = requests.post(f"{cluster.url}/generate", json=body, headers=headers, timeout=120)
        served.add(resp.json()["meta_info"]["replica"])
    assert len(served) == 1

    @sgl.function
    def chat(s):
        s += sgl.system("You answer in one word.")
        s += sgl.user("Name a colour.")
        s += sgl.assistant(sgl.gen("first", max_tokens=4))
        s += sgl.user("Name another one.")
        s += sgl.assistant(sgl.gen("second", max_tokens=4))

    backend = sgl.RuntimeEndpoint(cluster.url, api_key=API_KEY)
    try:
        state = chat.run(backend=backend)
    finally:
        backend.close()
    assert state.get_meta_info("first")["replica"] == state.get_meta_info("second")["replica"]


def call(server: ServerHandle, method: str, path: str, key: str | None, body: dict | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, server.url + path, json=body, headers=headers, timeout=120)


def test_a_pin_draws_its_prefix_tenants_stay_apart_and_evict_frees_it(cluster) -> None:
    alpha_key, beta_key = list(TENANT_KEYS)
    manual = ("Pinned manual: the gateway routes each request to the replica that caches its prefix. " * 4).rstrip()

    def ask(key: str, question: str) -> dict:
        resp = call(
            cluster, "POST", "/generate", key, {"text": manual + question, "sampling_params": {"max_new_tokens": 1}}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()["meta_info"]

    for key in (None, API_KEY, alpha_key):
        assert call(cluster, "POST", "/cache/pin", key, {"text": manual, "ttl_s": 300}).status_code == 401
    pin = call(cluster, "POST", "/cache/pin", ADMIN_KEY, {"text": manual, "ttl_s": 300})
    assert pin.status_code == 200, pin.text
    pinned, home = pin.json(), pin.json()["replica"]
    assert pinned["tokens"] > 0 and pinned["predicted_cached_tokens"] == pinned["cached_tokens"] == 0
    held = {url: get(cluster, f"/cache_info?replica={url}").json()["pinned_tokens"] for url in replicas(cluster)}
    assert held[home] == pinned["tokens"] and sum(held.values()) == pinned["tokens"]
    assert [p["replica"] for p in get(cluster, "/cache_info").json()["pins"]] == [home]
    keyless = ask(API_KEY, " Where is my request served?")  # the admin's pin is in the keyless namespace
    assert keyless["replica"] == home and keyless["cached_tokens"] >= pinned["tokens"]
    assert keyless["predicted_cached_tokens"] == keyless["cached_tokens"]
    # a tenant never sees another namespace's prefix; its own next request finds its first
    first = ask(alpha_key, " Where is my request served?")
    assert first["cached_tokens"] == first["predicted_cached_tokens"] == 0
    again = ask(alpha_key, " And this one?")
    assert again["replica"] == first["replica"] and again["cached_tokens"] == again["predicted_cached_tokens"] > 0
    other = ask(beta_key, " And this one?")
    assert other["cached_tokens"] == other["predicted_cached_tokens"] == 0
    tenants = get(cluster, "/cache_info").json()["tenants"]
    assert tenants["alpha"]["cached_tokens_total"] == again["cached_tokens"] and tenants["beta"]["requests"] == 1
    # the page's snapshot of the pin's replica: all of it for the admin, its own runs for a tenant
    everyone, beta_only = (
        call(cluster, "GET", f"/cache/tree?replica={home}&depth=2", k) for k in (ADMIN_KEY, beta_key)
    )
    assert any(child["pinned"] for child in everyone.json()["root"]["children"])
    assert not any(child["pinned"] for child in beta_only.json()["root"]["children"])
    assert beta_only.json()["root"]["subtree_tokens"] < everyone.json()["root"]["subtree_tokens"]
    # unpin and evict reach every replica: an evict frees the keyless runs of the prefix, alpha's stay
    assert call(cluster, "POST", "/cache/evict", alpha_key, {"text": manual}).status_code == 401
    unpinned = call(cluster, "DELETE", "/cache/pin", ADMIN_KEY, {"text": manual})
    assert unpinned.json() == {"unpinned": True, "tokens": pinned["tokens"], "replicas": [home]}
    assert call(cluster, "DELETE", "/cache/pin", ADMIN_KEY, {"text": manual}).status_code == 404
    evicted = call(cluster, "POST", "/cache/evict", ADMIN_KEY, {"text": manual}).json()
    assert evicted["evicted_tokens"] == sum(evicted["replicas"].values()) >= keyless["cached_tokens"]
    assert ask(API_KEY, " Where is my request served?")["cached_tokens"] == 0
    assert ask(alpha_key, " Where is my request served?")["cached_tokens"] > 0
    # the keys reached the replicas in their environment, never on a command line
    for pid in descendants(cluster.process.pid):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert ADMIN_KEY.encode() not in cmdline and API_KEY.encode() not in cmdline


def test_a_tenants_anthropic_client_is_its_tenant_through_the_gateway(cluster) -> None:
    """The Anthropic SDK sends its key as x-api-key: the gateway reads the tenant from it (its
    prediction salted so), passes it on, and the cache's reads come back in Anthropic's usage."""
    alpha_key, beta_key = list(TENANT_KEYS)
    system = "Tenant handbook: every answer cites the section it comes from, by its number. " * 5

    def ask(key: str, question: str) -> dict:
        client = anthropic.Anthropic(base_url=cluster.url, api_key=key, timeout=120, max_retries=0)
        raw = client.messages.with_raw_response.create(
            model="any", max_tokens=1, system=system, messages=[{"role": "user", "content": question}]
        )
        return raw.http_response.json()["usage"]

    first = ask(alpha_key, "Where is the index?")
    again = ask(alpha_key, "Where is the glossary?")
    assert again["replica"] == first["replica"]
    assert again["cache_read_input_tokens"] == again["predicted_cached_tokens"] > 50
    other = ask(beta_key, "Where is the glossary?")  # another tenant's namespace holds none of it
    assert other["cache_read_input_tokens"] == other["predicted_cached_tokens"] < 10


def test_the_admin_pins_for_a_tenant_and_the_tenants_requests_go_where_it_is(cluster) -> None:
    alpha_key, beta_key = list(TENANT_KEYS)
    manual = ("Alpha's handbook: every answer cites the section it comes from, and nothing else. " * 4).rstrip()
    body = {"text": manual, "ttl_s": 300, "tenant": "alpha"}
    assert call(cluster, "POST", "/cache/pin", ADMIN_KEY, {**body, "tenant": "gamma"}).status_code == 400
    pin = call(cluster, "POST", "/cache/pin", ADMIN_KEY, body)
    assert pin.status_code == 200, pin.text
    home, tokens = pin.json()["replica"], pin.json()["tokens"]

    def ask(key: str) -> dict:
        request = {"text": manual + " Which section?", "sampling_params": {"max_new_tokens": 1}}
        resp = call(cluster, "POST", "/generate", key, request)
        assert resp.status_code == 200, resp.text
        return resp.json()["meta_info"]

    alpha = ask(alpha_key)
    assert alpha["replica"] == home and alpha["cached_tokens"] == alpha["predicted_cached_tokens"] >= tokens
    beta = ask(beta_key)
    assert beta["cached_tokens"] == beta["predicted_cached_tokens"] == 0
    unpinned = call(cluster, "DELETE", "/cache/pin", ADMIN_KEY, {"text": manual, "tenant": "alpha"})
    assert unpinned.json()["replicas"] == [home]


def test_the_cache_page_at_the_gateway_draws_the_replica_chosen(cluster, chromium) -> None:
    page = page_nodes(chromium, f"{cluster.url}/cache#key={API_KEY}")
    assert page.options_of["replica"] == list(replicas(cluster))  # the selector, the first available one chosen
    assert int(page.text_of["tree-nodes"]) == get(cluster, "/cache_info?replica=0").json()["tree_nodes"]
