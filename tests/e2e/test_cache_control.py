"""The cache page and cache control against a real `radixcluster up` with a small KV pool: a pin
outlives a flood that evicts everything else, and ends at its TTL; evict-by-prefix frees exactly
its runs; the admin key guards the control calls; the page and the tree snapshot are served."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
import requests

from support.api_helpers import TIMEOUT_S, assert_error, generate, get, metric_value, post, wait_idle
from support.cache_page import browse, page_nodes
from support.servers import ServerHandle, launch_server

pytestmark = pytest.mark.slow

POOL = 600  # tokens; pins may hold half
ADMIN = {"Authorization": "Bearer boss"}
PINNED = "You are a careful assistant who answers questions about geography." * 4
HEADER = "You are a terse assistant. Answer briefly and precisely." * 3
# eight prompts of ~100 tokens that share no first token: 800 tokens through a pool of 600
FLOOD = [f"{word} " + "apples and oranges are fruit, and carrots are not. " * 8 for word in "ABCDEFGH"]
POLL_LIMIT_S = 120


TENANTS = {"ka": "alpha", "kb": "beta", "kc": "gamma"}  # --api-key-file: key -> tenant
QUOTAS = {"gamma": {"max_cached_tokens": 120, "max_running_requests": 1}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({key: {"tenant": name, **QUOTAS.get(name, {})} for key, name in TENANTS.items()}))
    flags = (
        "--max-total-tokens",
        str(POOL),
        "--admin-api-key",
        "boss",
        "--cache-page-text",
        "--api-key-file",
        str(keys),
    )
    with launch_server(*flags, api_key="k") as handle:
        yield handle


@pytest.fixture(autouse=True)
def empty_cache(server: ServerHandle) -> None:
    wait_idle(server)
    assert post(server, "/flush_cache", {}).status_code == 200


def admin(server: ServerHandle, method: str, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.request(method, server.url + path, json=body, headers=ADMIN, timeout=TIMEOUT_S)


def cache_info(server: ServerHandle) -> dict[str, Any]:
    resp = get(server, "/cache_info")
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(server: ServerHandle, text: str) -> int:
    """The cached_tokens of a one-token generation of ``text``."""
    return generate(server, text, max_new_tokens=1)["meta_info"]["cached_tokens"]


def flood(server: ServerHandle) -> None:
    for text in FLOOD:
        generate(server, text, max_new_tokens=1)


def test_a_pinned_prefix_survives_a_flood_that_evicts_everything_else(server):
    pin = admin(server, "POST", "/cache/pin", {"text": PINNED, "ttl_s": 600})
    assert pin.status_code == 200, pin.text
    pinned = pin.json()
    assert pinned["tokens"] == pinned["prompt_tokens"] == pinned["pinned_tokens"] > 30
    assert pinned["prefilled_tokens"] == pinned["prompt_tokens"]
    evicted_before = cache_info(server)["evicted_tokens_total"]
    flood(server)
    info = cache_info(server)
    assert info["evicted_tokens_total"] > evicted_before
    assert info["pinned_tokens"] == pinned["tokens"] and [p["id"] for p in info["pins"]] == [pinned["id"]]
    assert cached(server, FLOOD[0]) == 0  # the oldest of the flood is gone
    assert cached(server, PINNED) == pinned["prompt_tokens"] - 1  # all but the token computed for logits
    unpin = admin(server, "DELETE", "/cache/pin", {"text": PINNED})
    assert unpin.status_code == 200 and unpin.json() == {"unpinned": True, "tokens": pinned["tokens"]}
    assert_error(admin(server, "DELETE", "/cache/pin", {"text": PINNED}), 404, "no pin")
    assert cache_info(server)["pinned_tokens"] == 0


def test_a_pin_ends_at_its_ttl_and_its_prefix_can_then_be_evicted(server):
    pin = admin(server, "POST", "/cache/pin", {"text": PINNED, "ttl_s": 2})
    assert pin.status_code == 200, pin.text
    deadline = time.monotonic() + POLL_LIMIT_S
    while cache_info(server)["pins"] and time.monotonic() < deadline:
        time.sleep(0.2)
    info = cache_info(server)
    assert info["pins"] == [] and info["pinned_tokens"] == 0 and info["protected_tokens"] == 0
    flood(server)
    assert cached(server, PINNED) == 0


def test_evict_by_prefix_frees_exactly_the_runs_that_start_with_it(server):
    first, second, other = HEADER + " What is 2+2?", HEADER + " What is 3+3?", FLOOD[0]
    a = generate(server, first, max_new_tokens=1)["meta_info"]
    shared = generate(server, second, max_new_tokens=1)["meta_info"]["cached_tokens"]
    generate(server, other, max_new_tokens=1)
    assert shared > 20
    before = cache_info(server)
    resp = admin(server, "POST", "/cache/evict", {"text": first})
    assert resp.status_code == 200, resp.text
    freed = resp.json()["evicted_tokens"]
    assert freed == a["prompt_tokens"] - shared  # its own run; the shared header stays
    after = cache_info(server)
    assert after["cached_tokens"] == before["cached_tokens"] - freed
    assert after["evicted_tokens_total"] == before["evicted_tokens_total"] + freed
    assert after["free_pages"] == before["free_pages"] + freed
    assert cached(server, second) == generate(server, second, max_new_tokens=1)["meta_info"]["prompt_tokens"] - 1
    assert cached(server, first) == shared
    assert admin(server, "POST", "/cache/evict", {"text": "never sent"}).json()["evicted_tokens"] == 0


def test_the_admin_key_guards_control_and_the_pin_bound_is_a_400(server):
    body = {"text": PINNED, "ttl_s": 60}
    assert_error(post(server, "/cache/pin", body), 401, "admin key")
    assert_error(post(server, "/start_profile", {}), 401, "admin key")  # the profiler writes files on the server
    assert_error(requests.post(server.url + "/cache/evict", json=body, timeout=TIMEOUT_S), 401, "API key")
    warm = admin(server, "POST", "/cache/warm", {"text": PINNED})
    assert warm.status_code == 200 and warm.json()["prefilled_tokens"] == warm.json()["prompt_tokens"]
    assert admin(server, "POST", "/cache/warm", {"text": PINNED}).json()["prefilled_tokens"] == 1
    long_text = "Rivers of Europe and the cities along them, listed from north to south. " * 24
    assert_error(admin(server, "POST", "/cache/pin", {"text": long_text, "ttl_s": 60}), 400, "--max-pinned-fraction")
    assert cache_info(server)["pinned_tokens"] == 0


def test_the_page_and_the_tree_snapshot(server):
    assert requests.get(server.url + "/cache", timeout=TIMEOUT_S).status_code == 200  # public: no data in it
    generate(server, HEADER + " What is 2+2?", max_new_tokens=1)
    generate(server, HEADER + " What is 3+3?", max_new_tokens=1)
    snap = get(server, "/cache/tree?depth=3").json()
    (shared,) = snap["root"]["children"]
    assert shared["text"].startswith("You are") and shared["hits"] >= 1 and len(shared["children"]) == 2
    assert_error(get(server, "/cache/tree?depth=100"), 400, "depth")


def test_the_page_draws_the_tree_growing_and_the_shared_node_hit(server, chromium, tmp_path):
    before = page_nodes(chromium, f"{server.url}/cache#key=k")
    assert [n["data-id"] for n in before.nodes] == ["root"] and before.text_of["tree-nodes"] == "0"
    generate(server, HEADER + " What is 2+2?", max_new_tokens=1)
    generate(server, HEADER + " What is 3+3?", max_new_tokens=1)
    generate(server, HEADER + " What is 4+4?", max_new_tokens=1)
    after = page_nodes(chromium, f"{server.url}/cache#key=k")
    drawn = [n for n in after.nodes if n["data-id"] not in ("root", "folded")]
    assert len(drawn) >= 4 and int(after.text_of["tree-nodes"]) >= 4
    shared = max(drawn, key=lambda n: int(n["data-subtree"] or 0))  # the header all three share
    assert int(shared["data-hits"] or 0) >= 2
    assert all(int(n["data-hits"] or 0) == 0 for n in drawn if n is not shared and n["data-tokens"] != "1")
    shot = tmp_path / "cache-page.png"
    browse(chromium, f"{server.url}/cache#key=k", f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.stat().st_size > 10_000
    print(f"cache page screenshot: {shot}")


def as_tenant(server: ServerHandle, key: str, text: str, max_new_tokens: int = 1, **fields: Any) -> dict[str, Any]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    body = {"text": text, "sampling_params": params, **fields}
    resp = requests.post(
        server.url + "/generate", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT_S
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["meta_info"]


def test_tenants_never_share_cached_tokens_whatever_salt_they_send(server):
    before = cache_info(server).get("tenants", {})
    prompt = HEADER + " What is 5+5?"
    first = as_tenant(server, "ka", prompt)
    assert first["cached_tokens"] == 0
    assert as_tenant(server, "kb", prompt)["cached_tokens"] == 0  # the same prompt, another tenant
    assert as_tenant(server, "kb", prompt, cache_salt="")["cached_tokens"] == first["prompt_tokens"] - 1  # its own
    assert as_tenant(server, "ka", prompt)["cached_tokens"] == first["prompt_tokens"] - 1
    assert generate(server, prompt, max_new_tokens=1)["meta_info"]["cached_tokens"] == 0  # the plain key: no tenant
    forged = post(server, "/generate", {"text": prompt, "cache_salt": "\x00tenant\x00alpha\x00"})
    assert_error(forged, 400, "cache_salt")
    tenants = cache_info(server)["tenants"]
    for name in ("alpha", "beta"):
        assert tenants[name]["requests"] - before.get(name, {}).get("requests", 0) == 2
    cached = tenants["alpha"]["cached_tokens_total"] - before.get("alpha", {}).get("cached_tokens_total", 0)
    assert cached == first["prompt_tokens"] - 1
    assert (
        metric_value(server, 'radixcluster_tenant_cached_tokens_total{tenant="alpha"}')
        == tenants["alpha"]["cached_tokens_total"]
    )
    own = requests.get(server.url + "/cache/tree", headers={"Authorization": "Bearer ka"}, timeout=TIMEOUT_S).json()
    assert own["root"]["subtree_tokens"] == first["prompt_tokens"]  # alpha's run only, not beta's or the plain one


def test_a_tenant_over_its_quotas_evicts_its_own_prefixes_and_runs_one_request_at_a_time(server):
    first, second = (f"{word} " + "pears and plums grow on trees in the orchard. " * 6 for word in "XY")
    prompt_tokens = as_tenant(server, "kc", first)["prompt_tokens"]
    assert 60 < prompt_tokens <= 120  # one run fits the quota of 120 tokens, two do not
    other = as_tenant(server, "ka", second)  # another tenant's run is not gamma's to evict
    as_tenant(server, "kc", second)
    gamma = cache_info(server)["tenants"]["gamma"]
    assert 0 < gamma["cached_tokens"] <= 120
    assert metric_value(server, 'radixcluster_tenant_tree_tokens{tenant="gamma"}') == gamma["cached_tokens"]
    assert as_tenant(server, "kc", second)["cached_tokens"] > 0  # the newer run stayed
    assert as_tenant(server, "ka", second)["cached_tokens"] == other["prompt_tokens"] - 1
    assert as_tenant(server, "kc", first)["cached_tokens"] == 0  # the older one made room

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(as_tenant, server, "kc", f"Count to {n}:", 24) for n in (10, 20, 30)]
        running, waiting = [], []
        while not all(f.done() for f in futures):
            running.append(metric_value(server, "radixcluster_num_running_reqs"))
            waiting.append(metric_value(server, "radixcluster_num_waiting_reqs"))
            time.sleep(0.05)
        assert all(f.result()["completion_tokens"] == 24 for f in futures)
    assert max(running) == 1 and max(waiting) >= 1


def test_openai_requests_pin_through_the_cache_control_field(server):
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="boss", timeout=TIMEOUT_S, max_retries=0)
    model = sdk.models.list().data[0].id
    system = {"role": "system", "content": PINNED, "cache_control": {"type": "ephemeral", "ttl": "10m"}}

    def ask(question: str, client: openai.OpenAI = sdk) -> Any:
        messages = [system, {"role": "user", "content": question}]
        return client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0)

    first = ask("Name a river.").usage
    pinned = first.prompt_tokens_details.pinned_tokens
    assert 40 < pinned < first.prompt_tokens - 4  # the system message, not the question
    assert [p["tokens"] for p in cache_info(server)["pins"]] == [pinned]
    flood(server)
    assert ask("Name a mountain.").usage.prompt_tokens_details.cached_tokens == pinned

    completion = sdk.completions.create(
        model=model, prompt=HEADER, max_tokens=1, extra_body={"cache_control": {"ttl": 60}}
    ).usage
    assert completion.prompt_tokens_details.pinned_tokens == completion.prompt_tokens
    plain = openai.OpenAI(base_url=server.url + "/v1", api_key="k", timeout=TIMEOUT_S, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="admin key"):
        ask("Name a lake.", plain)
    with pytest.raises(openai.BadRequestError, match="ttl"):
        sdk.completions.create(model=model, prompt="hi", max_tokens=1, extra_body={"cache_control": {"ttl": "1y"}})


def test_anthropic_cache_control_pins_for_the_admin_and_caches_for_the_others(server):
    """The Messages API's cache_control on the system prompt pins it with the admin key; with
    another key the request is answered, its prompt cached as any prompt is, and nothing pinned.
    A tenant's x-api-key reads its own namespace."""

    def ask(key: str, system: str, question: str) -> Any:
        sdk = anthropic.Anthropic(base_url=server.url, api_key=key, timeout=TIMEOUT_S, max_retries=0)
        marked = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral", "ttl": "10m"}}]
        return sdk.messages.create(
            model="any", max_tokens=1, system=marked, messages=[{"role": "user", "content": question}]
        ).usage

    first = ask("boss", PINNED, "Name a river.")
    (pin,) = cache_info(server)["pins"]
    assert 40 < pin["tokens"] < first.input_tokens - 4  # the system message, not the question
    flood(server)
    assert ask("boss", PINNED, "Name a mountain.").cache_read_input_tokens == pin["tokens"]
    assert ask("k", HEADER, "Name a lake.").input_tokens > 0
    assert [p["tokens"] for p in cache_info(server)["pins"]] == [pin["tokens"]]
    assert ask("k", HEADER, "Name a sea.").cache_read_input_tokens > 30  # cached all the same
    ask("ka", HEADER, "Name a sea.")
    assert ask("ka", HEADER, "Name a bay.").cache_read_input_tokens > 30
    assert ask("kb", HEADER, "Name a bay.").cache_read_input_tokens == 0  # another tenant's namespace


def test_the_admin_pins_and_evicts_inside_a_tenants_namespace_by_naming_it(server):
    body = {"text": PINNED, "ttl_s": 600, "tenant": "alpha"}
    pinned = admin(server, "POST", "/cache/pin", body)
    assert pinned.status_code == 200, pinned.text
    tokens = pinned.json()["tokens"]
    question = PINNED + " Which river is the longest?"
    assert as_tenant(server, "ka", question)["cached_tokens"] == tokens  # alpha's namespace
    assert as_tenant(server, "kb", question)["cached_tokens"] == 0
    assert cached(server, question) == 0  # the admin's own namespace holds nothing of it
    # each tenant's /cache_info shows its own pins and counters only; the admin's, everyone's
    seen = {
        key: requests.get(
            f"{server.url}/cache_info", headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT_S
        ).json()
        for key in ("ka", "kb")
    }
    assert [pin["tokens"] for pin in seen["ka"]["pins"]] == [tokens] and seen["kb"]["pins"] == []
    assert set(seen["ka"]["tenants"]) == {"alpha"} and set(seen["kb"]["tenants"]) == {"beta"}
    assert {"alpha", "beta"} <= set(admin(server, "GET", "/cache_info", {}).json()["tenants"])
    flood(server)
    assert as_tenant(server, "ka", question)["cached_tokens"] >= tokens  # the pin held through the flood
    assert admin(server, "POST", "/cache/pin", {**body, "tenant": "delta"}).status_code == 400
    unpinned = admin(server, "DELETE", "/cache/pin", {"text": PINNED, "tenant": "alpha"})
    assert unpinned.status_code == 200 and unpinned.json()["unpinned"]
    evicted = admin(server, "POST", "/cache/evict", {"text": PINNED, "tenant": "alpha"}).json()["evicted_tokens"]
    assert evicted >= tokens
    assert as_tenant(server, "ka", question)["cached_tokens"] == 0
