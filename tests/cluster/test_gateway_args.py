"""The flags of `radixcluster gateway`: where the replicas are, how to route, refused mistakes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway_args import add_gateway_args, gateway_config_from_namespace


def parse(*argv: str) -> GatewayConfig:
    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    return gateway_config_from_namespace(parser.parse_args(list(argv)))


def test_replicas_keys_and_tunables_reach_the_config():
    config = parse(
        "--replica=http://10.0.0.7:30000",
        "--replica=http://10.0.0.8:30000",
        "--api-key=k",
        "--load-weight=0.1",
        "--policy=round-robin",
        "--breaker-failures=5",
    )
    assert config.replicas == ["http://10.0.0.7:30000", "http://10.0.0.8:30000"]
    assert (config.api_key, config.replica_api_key) == ("k", "k")  # the replicas want the same key by default
    assert (config.routing.policy, config.routing.load_weight, config.routing.min_overlap) == ("round-robin", 0.1, 0.25)
    assert config.health.breaker_failures == 5 and config.model_path.suffix == ".gguf"
    assert parse("--discover=replicas.serving.svc:30000", "--replica-api-key=r").replica_api_key == "r"


def test_the_replicas_chat_template_reaches_the_config(tmp_path: Path):
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert parse("--replica", "http://127.0.0.1:1", "--chat-template", str(file)).chat_template == file.read_text()
    assert parse("--replica", "http://127.0.0.1:1").chat_template is None
    with pytest.raises(ValueError, match="no such file"):
        parse("--replica", "http://127.0.0.1:1", "--chat-template", str(tmp_path / "none.jinja"))


def test_the_replicas_tokenizer_path_reaches_the_config(model_path: Path, tmp_path: Path):
    assert parse("--replica", "http://127.0.0.1:1", "--tokenizer", str(model_path)).tokenizer_path == model_path
    assert parse("--replica", "http://127.0.0.1:1").tokenizer_path == model_path  # the model's own
    with pytest.raises(ValueError, match="neither a directory with tokenizer.json nor a .gguf file"):
        parse("--replica", "http://127.0.0.1:1", "--tokenizer-path", str(tmp_path))


def test_the_replicas_admin_and_tenants_keys_reach_the_config(tmp_path: Path, monkeypatch):
    keys = tmp_path / "keys.json"
    keys.write_text('{"ka": {"tenant": "alpha"}, "kb": {"tenant": "beta"}}')
    config = parse("--replica=http://a:1", f"--api-key-file={keys}", "--admin-api-key=boss")
    assert config.tenant_keys == {"ka": "alpha", "kb": "beta"} and config.admin_api_key == "boss"
    assert config.replica_api_key == "boss" and config.passes_client_keys  # no API key: its own calls carry the admin's
    monkeypatch.setenv("RADIXCLUSTER_ADMIN_API_KEY", "from-env")
    assert parse("--replica=http://a:1").admin_api_key == "from-env"
    monkeypatch.delenv("RADIXCLUSTER_ADMIN_API_KEY")
    assert not parse("--replica=http://a:1", "--api-key=k").passes_client_keys
    with pytest.raises(ValueError, match="--api-key-file"):
        parse("--replica=http://a:1", f"--api-key-file={tmp_path / 'missing.json'}")
    with pytest.raises(ValueError, match="--replica-api-key"):  # its polls would all be refused
        parse("--replica=http://a:1", f"--api-key-file={keys}")
    assert parse("--replica=http://a:1", f"--api-key-file={keys}", "--replica-api-key=r").replica_api_key == "r"


@pytest.mark.parametrize(
    "argv, words",
    [
        ((), "--replica URL"),
        (("--replica=10.0.0.7:30000",), "http://"),
        (("--replica=http://[::1",), "not a URL"),
        (("--replica=http://",), "no host"),
        (("--replica=http://a:99999",), "not a URL"),
        (("--replica=http://a:0",), "1-65535"),
        (("--replica=http://a:1/v1",), "without a path \\(http://a:1\\)"),  # an OpenAI base URL
        (("--replica=http://a:1", "--load-weight=nan"), "--load-weight must be a finite number"),
        (("--replica=http://a:1", "--load-weight=inf"), "--load-weight must be a finite number"),
        (("--discover=replicas.serving.svc",), "HOST:PORT"),
        (("--replica=http://a:1", "--min-overlap=2"), "--min-overlap"),
        (("--replica=http://a:1", "--health-interval=0"), "--health-interval"),
        (("--replica=http://a:1", "--health-interval=1e308"), "--health-interval"),
        (("--replica=http://a:1", "--breaker-cooldown=1e308"), "--breaker-cooldown"),
        (("--replica=http://a:1", "--shutdown-timeout=1e308"), "--shutdown-timeout"),
        (("--replica=http://a:1", "--port=65536"), "--port"),
        (("--replica=http://a:1", "--host=192.0.2.1"), "not an address of this machine"),
    ],
)
def test_mistakes_are_refused_with_a_message(argv, words):
    with pytest.raises(ValueError, match=words):
        parse(*argv)
