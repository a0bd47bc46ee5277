"""The flags of `radixcluster up`, including those users paste from SGLang."""

from __future__ import annotations

import argparse
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixcluster import __version__
from radixcluster.cli import main
from radixcluster.router.tenant_quota import TenantQuota
from radixcluster.server_args import (
    DTYPES,
    FP8_KV_CACHE_DTYPES,
    UNASSIGNED_PORTS,
    ServerArgs,
    add_cli_args,
    check_port_free,
    free_port,
    http_url,
    load_tenant_keys,
    load_tenant_quotas,
    local_url,
    replica_argv,
    server_args_from_namespace,
)


def parse(*argv: str) -> ServerArgs:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return server_args_from_namespace(parser.parse_args(list(argv)))


def test_defaults_match_the_design():
    args = parse()
    assert (args.host, args.port, args.tp_size, args.page_size) == ("127.0.0.1", 30000, 1, 1)
    assert args.model_path is None and args.schedule_policy == "lpm" and not args.disable_radix_cache


def test_the_seeds_production_flags_are_accepted(caplog):
    seed = "--mem-fraction-static 0.8 --chunked-prefill-size 1024 --enable-radix-cache --disable-flashinfer"
    with caplog.at_level(logging.WARNING):
        args = parse(*seed.split(), "--max-running-requests", "64", "--log-level", "warning", "--tp-size", "8")
    assert (args.mem_fraction_static, args.chunked_prefill_size, args.max_running_requests) == (0.8, 1024, 64)
    assert args.tp_size == 8 and not args.disable_radix_cache
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "--disable-flashinfer" in notices[0]


def test_prefix_caching_alias_mixed_chunk_and_dynamic_fraction_are_accepted(caplog):
    with caplog.at_level(logging.WARNING):
        args = parse("--enable-prefix-caching", "--enable-mixed-chunk", "--mem-fraction-dynamic", "0.1")
    assert not args.disable_radix_cache
    assert not any("--enable-mixed-chunk" in r.getMessage() for r in caplog.records)
    assert any("--mem-fraction-dynamic" in r.getMessage() for r in caplog.records)


def test_sglangs_serving_flags_are_accepted_and_those_that_mean_something_act(caplog):
    with caplog.at_level(logging.WARNING):
        args = parse(
            *"--enable-metrics --enable-torch-compile --cuda-graph-max-bs 8 --disable-custom-all-reduce".split(),
            *"--watchdog-timeout 300 --max-prefill-tokens 512 --stream-interval 4 --random-seed 42".split(),
            *"--tool-call-parser qwen25 --reasoning-parser deepseek-r1".split(),
        )
    notices = " ".join(r.getMessage() for r in caplog.records)
    for flag in ("--enable-torch-compile", "--cuda-graph-max-bs", "--disable-custom-all-reduce"):
        assert f"{flag} is accepted but has no effect" in notices
    assert "--enable-metrics" not in notices  # it names the default
    assert (args.step_timeout, args.stream_interval, args.random_seed) == (300, 4, 42)
    assert (args.chunked_prefill_size, args.step_prompt_tokens(8192)) == (2048, 512)
    assert parse("--max-prefill-tokens", "16384").step_prompt_tokens(8192) == 2048  # SGLang's default: no cap
    again = parse(*replica_argv(args, exclude=()))
    assert (again.step_timeout, again.max_prefill_tokens, again.stream_interval, again.random_seed) == (300, 512, 4, 42)
    assert args.tool_call_parser == again.tool_call_parser == "qwen25"
    assert args.reasoning_parser == again.reasoning_parser == "deepseek-r1"
    with pytest.raises(SystemExit):
        parse("--tool-call-parser", "no_such_format")  # argparse names the choices


def test_sglangs_and_vllms_spellings_of_values_are_read_as_ours():
    """-1 chunks no prompt (a step takes up to the context length, or --max-prefill-tokens);
    half / float are float16 / float32; vLLM's fp8 cache is e4m3; a log level in any case."""
    assert parse("--chunked-prefill-size", "-1").step_prompt_tokens(8192) == 8192
    assert parse("--chunked-prefill-size", "-1", "--max-prefill-tokens", "4096").step_prompt_tokens(8192) == 4096
    with pytest.raises(ValueError, match="-1 \\(prompts not chunked\\)"):
        parse("--chunked-prefill-size", "0")
    assert DTYPES[parse("--dtype", "half").dtype] == "float16" and DTYPES[parse("--dtype", "float").dtype] == "float32"
    assert FP8_KV_CACHE_DTYPES[parse("--kv-cache-dtype", "fp8").kv_cache_dtype] == "float8_e4m3fn"
    assert parse("--log-level", "INFO").log_level == "info"


def test_token_counts_read_vllms_human_readable_numbers(capsys):
    args = parse("--max-model-len", "32k", "--max-total-tokens", "1K", "--max-num-batched-tokens", "25.6k")
    assert (args.context_length, args.max_total_tokens, args.chunked_prefill_size) == (32000, 1024, 25600)
    assert parse("--max-prefill-tokens", "2M").max_prefill_tokens == 2 * 2**20
    assert parse("--chunked-prefill-size", "-1").chunked_prefill_size == -1
    for bad, words in (("1.5K", "needs k, m or g"), ("0.0001k", "not a whole number"), ("lots", "not a count")):
        with pytest.raises(SystemExit):
            parse("--max-total-tokens", bad)
        assert words in capsys.readouterr().err


def test_vllms_names_of_the_same_flags_act_as_ours():
    args = parse(
        *"--max-model-len 1024 --max-num-seqs 8 --block-size 16 --seed 7 --max-num-batched-tokens 4096".split()
    )
    assert (args.context_length, args.max_running_requests, args.page_size) == (1024, 8, 16)
    assert (args.random_seed, args.chunked_prefill_size, args.step_prompt_tokens(8192)) == (7, 4096, 4096)
    assert parse("--enable-log-requests").log_requests and parse("--log-requests").log_requests
    assert not parse().log_requests


def test_a_chat_template_and_a_tokenizer_are_checked_before_anything_starts_and_reach_every_replica(
    tmp_path, model_path
):
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    args = parse("--chat-template", str(file), "--tokenizer", str(model_path), "--dp-size", "2")
    assert (args.chat_template, args.tokenizer_path) == (str(file), str(model_path))
    again = parse(*replica_argv(args, exclude=("dp_size",)))
    assert (again.chat_template, again.tokenizer_path) == (str(file), str(model_path))
    with pytest.raises(ValueError, match="no such file, nor a Jinja template"):
        parse("--chat-template", "llama-2")


def test_sglangs_schedule_conservativeness_and_decode_log_interval():
    args = parse("--schedule-conservativeness", "1.3", "--dp-size", "2")
    assert args.schedule_conservativeness == 1.3
    assert parse(*replica_argv(args, exclude=("dp_size",))).schedule_conservativeness == 1.3
    for bad in ("0", "nan", "inf"):
        with pytest.raises(ValueError, match="--schedule-conservativeness must be a finite number > 0"):
            parse("--schedule-conservativeness", bad)
    assert (parse().decode_log_interval, parse("--decode-log-interval", "10").decode_log_interval) == (40, 10)
    with pytest.raises(ValueError, match="--decode-log-interval must be >= 1"):
        parse("--decode-log-interval", "0")


def test_more_pasted_flags_are_accepted_and_only_the_meaningless_ones_say_so(caplog):
    defaults = "--enable-cache-report --disable-overlap-schedule --enable-chunked-prefill --enable-auto-tool-choice"
    quiet = (
        "--disable-log-requests --disable-fastapi-docs --grammar-backend xgrammar --tokenizer-mode auto"
        # vLLM's names, from its examples' launch lines
        " --guided-decoding-backend xgrammar --structured-outputs-config.backend auto --runner auto --runner generate"
        ' --enable-reasoning --structured-outputs-config {"backend":"xgrammar"}'
    )
    meaningless = (
        "--skip-server-warmup --enforce-eager --swap-space 4 --sampling-backend pytorch --disable-log-stats"
        " --enable-p2p-check --uvicorn-log-level info --revision main --download-dir /models"
        " --load-balance-method round_robin"
    )
    with caplog.at_level(logging.WARNING):
        assert parse(*defaults.split(), *quiet.split(), *meaningless.split()) == parse()
    notices = [r.getMessage() for r in caplog.records]
    flags = [word for word in meaningless.split() if word.startswith("--")]
    assert len(notices) == len(flags) == 10
    for flag in flags:
        assert any(f"{flag} is accepted but has no effect" in notice for notice in notices)
    for flag, value in (
        ("--grammar-backend", "outlines"),
        ("--tokenizer-mode", "slow"),
        ("--structured-outputs-config.backend", "outlines"),
        ("--runner", "pooling"),
    ):
        with pytest.raises(SystemExit):
            parse(flag, value)  # argparse names the one that runs


@pytest.mark.parametrize(
    "value, error",
    [
        ('{"backend": "outlines"}', "backend 'outlines': accepted are auto, xgrammar"),
        (
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
            "only its backend is kept here, not disable_any_whitespace",
        ),
        ("xgrammar", "'xgrammar' is not a JSON object"),
    ],
)
def test_vllms_structured_outputs_config_as_json_is_refused_past_its_backend(capsys, value: str, error: str):
    """It was taken for an abbreviation of --structured-outputs-config.backend, whose choices
    then refused the JSON."""
    with pytest.raises(SystemExit):
        parse("--structured-outputs-config", value)
    assert f"argument --structured-outputs-config: {error}" in capsys.readouterr().err


def test_vllms_memory_load_and_quantization_flags(capsys):
    args = parse("--gpu-memory-utilization", "0.9", "--load-format", "gguf", "-q", "gguf", "--dp-size", "2")
    assert (args.gpu_memory_utilization, args.load_format, args.quantization) == (0.9, "gguf", "gguf")
    again = parse(*replica_argv(args, exclude=("dp_size",)))
    assert (again.gpu_memory_utilization, again.load_format, again.quantization) == (0.9, "gguf", "gguf")
    with pytest.raises(ValueError, match="--gpu-memory-utilization must be in"):
        parse("--gpu-memory-utilization", "1.5")
    with pytest.raises(ValueError, match="one of --mem-fraction-static and vLLM's --gpu-memory-utilization"):
        parse("--gpu-memory-utilization", "0.9", "--mem-fraction-static", "0.3")
    with pytest.raises(ValueError, match="--quantization awq is not supported: weights are served unquantized"):
        parse("--quantization", "awq")
    with pytest.raises(SystemExit):
        parse("--load-format", "pt")
    assert "invalid choice: 'pt'" in capsys.readouterr().err


def test_sglangs_multi_node_flags_point_to_ray(caplog):
    with caplog.at_level(logging.WARNING):
        assert (
            parse("--nnodes", "1", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000", "--show-time-cost")
            == parse()
        )
    assert "--dist-init-addr is accepted but has no effect" in caplog.text
    assert "--show-time-cost is accepted but has no effect" in caplog.text
    for argv in (("--nnodes", "2"), ("--nnodes", "2", "--node-rank", "1")):
        with pytest.raises(ValueError, match="radixcluster spans nodes through Ray.*--ray-address"):
            parse(*argv)


@pytest.mark.parametrize("sglang, ours", [("torch_native", "torch"), ("intel_amx", "native"), ("flashinfer", "auto")])
def test_sglangs_attention_backend_names_run_ours(caplog, sglang, ours):
    with caplog.at_level(logging.WARNING):
        assert parse("--attention-backend", sglang).attention_backend == ours
    assert f"--attention-backend {sglang} is SGLang's name; the {ours} backend runs here" in caplog.text


def test_kv_cache_dtype_takes_sglangs_names(capsys):
    assert parse().kv_cache_dtype == "auto"
    assert parse("--kv-cache-dtype", "fp8_e5m2").kv_cache_dtype == "fp8_e5m2"
    args = parse("--dp-size", "2", "--kv-cache-dtype", "fp8_e4m3")
    assert replica_argv(args, exclude=("dp_size",)) == ["--kv-cache-dtype", "fp8_e4m3"]
    with pytest.raises(SystemExit):
        parse("--kv-cache-dtype", "int8")
    assert "invalid choice: 'int8'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--tp-size", "0"], "--tp-size"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
        (["--page-size", "0"], "--page-size"),
        (["--port", "0"], "--port"),
        (["--port", "99999"], "--port"),  # the socket layer would listen on 34463
        (["--host", "999.1.1.1"], "is not an address"),
        (["--host", "192.0.2.1"], "not an address of this machine"),  # TEST-NET-1: never local
        (["--disable-radix-cache", "--enable-radix-cache"], "contradicts"),
        (["--stream-interval", "0"], "--stream-interval"),
        (["--context-length", "-5"], "--context-length must be >= 2"),
        (["--step-timeout", "1e308"], "--step-timeout must be in"),  # every step failed: inf ms
        (["--shutdown-timeout", "1e308"], "--shutdown-timeout must be in"),  # SIGTERM hung
        (["--context-length", "1"], r"--context-length must be >= 2 \(a prompt token and an output token\)"),
        (["--max-total-tokens", "1"], "--max-total-tokens must hold at least one page and two tokens"),
        (["--max-prefill-tokens", "8", "--page-size", "16"], "--max-prefill-tokens must hold at least one page"),
        (["--random-seed", "-1"], "--random-seed"),
    ],
)
def test_bad_values_say_what_is_wrong(argv, words):
    with pytest.raises(ValueError, match=words):
        parse(*argv)


def test_scale_out_flags_are_checked_against_each_other():
    args = parse("--dp-size", "3", "--ray-address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.2")
    assert (args.dp_size, args.node_ip_address) == (3, "10.0.0.2")
    assert parse("--kv-events-address", "tcp://0.0.0.0:5557").kv_events_address == "tcp://0.0.0.0:5557"
    for argv, words in (
        (("--kv-events-address", "ipc:///tmp/x"), "tcp://"),
        (("--dp-size", "2", "--kv-events-address", "tcp://0.0.0.0:0"), "each replica"),
        (("--node-ip-address", "10.0.0.2"), "--ray-address"),
        (("--dp-size", "0"), "--dp-size"),
    ):
        with pytest.raises(ValueError, match=words):
            parse(*argv)


def test_replica_argv_reproduces_the_flags_it_keeps():
    args = parse("--dp-size", "2", "--page-size", "16", "--disable-radix-cache", "--api-key", "k", "--port", "9")
    argv = replica_argv(args, exclude=("port", "dp_size"))
    assert argv == ["--page-size", "16", "--disable-radix-cache", "--api-key", "k"]
    again = parse(*argv)
    assert (again.page_size, again.disable_radix_cache, again.api_key, again.dp_size, again.port) == (
        16,
        True,
        "k",
        1,
        30000,
    )


def test_the_api_key_comes_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("RADIXCLUSTER_API_KEY", "from-env")
    assert parse().api_key == "from-env"
    assert parse("--api-key", "from-flag").api_key == "from-flag"
    monkeypatch.setenv("RADIXCLUSTER_API_KEY", "")
    assert parse().api_key is None


def test_admission_shutdown_and_supervision_flags():
    args = parse(
        "--max-queued-requests", "8", "--shutdown-timeout", "2.5", "--step-timeout", "90", "--max-worker-restarts", "0"
    )
    assert (args.max_queued_requests, args.shutdown_timeout, args.step_timeout, args.max_worker_restarts) == (
        8,
        2.5,
        90.0,
        0,
    )
    d = parse()
    assert (d.max_queued_requests, d.shutdown_timeout, d.step_timeout, d.max_worker_restarts) == (2048, 30.0, 600.0, 3)
    bad = (("--max-queued-requests", "0"), ("--shutdown-timeout", "-1"), ("--step-timeout", "0"))
    for argv in (*bad, ("--max-worker-restarts", "-1")):
        with pytest.raises(ValueError, match=argv[0]):
            parse(*argv)


def test_cache_page_and_control_flags(monkeypatch):
    defaults = parse()
    assert (defaults.cache_page_text, defaults.max_pinned_fraction, defaults.admin_api_key) == (False, 0.5, None)
    args = parse("--cache-page-text", "--max-pinned-fraction", "0.25", "--admin-api-key", "boss")
    assert (args.cache_page_text, args.max_pinned_fraction, args.admin_api_key) == (True, 0.25, "boss")
    monkeypatch.setenv("RADIXCLUSTER_ADMIN_API_KEY", "from-env")
    assert parse().admin_api_key == "from-env"
    with pytest.raises(ValueError, match="--max-pinned-fraction"):
        parse("--max-pinned-fraction", "1.5")
    assert parse("--dp-size", "2", "--admin-api-key", "boss").admin_api_key == "boss"  # the gateway serves them


def test_the_api_key_file_names_tenants_and_says_what_is_wrong_with_it(tmp_path):
    good = tmp_path / "keys.json"
    good.write_text('{"ka": {"tenant": "alpha"}, "kb": {"tenant": "beta"}}')
    assert load_tenant_keys(str(good)) == {"ka": "alpha", "kb": "beta"}
    assert load_tenant_quotas(str(good)) == {}
    good.write_text(
        '{"ka": {"tenant": "alpha", "max_cached_tokens": 4096, "max_running_requests": 2}, "kb": {"tenant": "beta"}}'
    )
    assert load_tenant_quotas(str(good)) == {"alpha": TenantQuota(max_cached_tokens=4096, max_running_requests=2)}
    assert parse("--api-key-file", str(good)).api_key_file == str(good)
    assert parse("--dp-size", "2", "--api-key-file", str(good)).api_key_file == str(good)
    for text, words in (
        ("not json", "--api-key-file"),
        ("[]", "expected"),
        ('{"ka": {"name": "alpha"}}', "tenant"),
        ('{"ka": {"tenant": "alpha", "max_cache": 5}}', "unknown fields"),
        ('{"ka": {"tenant": "alpha", "max_cached_tokens": 0}}', "max_cached_tokens must be a positive integer"),
        ('{"ka": {"tenant": "alpha", "max_running_requests": "2"}}', "max_running_requests must be"),
        ('{"ka": {"tenant": "a", "max_running_requests": 2}, "kb": {"tenant": "a"}}', "other quotas"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=words):
            parse("--api-key-file", str(bad))
    with pytest.raises(ValueError, match="No such file"):
        parse("--api-key-file", str(tmp_path / "missing.json"))


@pytest.mark.parametrize("command", [["up"], ["gateway", "--replica", "http://127.0.0.1:1"]])
def test_a_port_another_server_listens_on_is_refused_before_anything_starts(command, capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"--port {port} is in use"):
            check_port_free("127.0.0.1", port)
        assert main([*command, "--port", str(port)]) == 2
    assert f"--port {port} is in use on 127.0.0.1" in capsys.readouterr().err
    check_port_free("127.0.0.1", port)  # free again once closed


def test_urls_of_a_listen_address_bracket_ipv6_and_reach_a_wildcard_by_the_loopback():
    assert http_url("::1", 8000) == "http://[::1]:8000" and http_url("10.0.0.2", 8000) == "http://10.0.0.2:8000"
    assert local_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    # asyncio's socket on :: takes IPv6 only: the launcher's checks waited on 127.0.0.1 for ever
    assert local_url("::", 30000) == local_url("::1", 30000) == "http://[::1]:30000"


def test_a_kv_events_port_in_use_is_refused_before_anything_starts(capsys):
    with socket.create_server(("127.0.0.1", 0)) as free:
        api_port = free.getsockname()[1]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        argv = ["up", "--host", "127.0.0.1", "--port", str(api_port), "--kv-events-address", f"tcp://127.0.0.1:{port}"]
        assert main(argv) == 2
    assert f"the --kv-events-address port {port} is in use on 127.0.0.1" in capsys.readouterr().err
    for bad in ("tcp://127.0.0.1", "tcp://:5557", "tcp://host:x", "tcp://h:70000"):
        with pytest.raises(ValueError, match="tcp://HOST:PORT"):
            parse("--kv-events-address", bad)
    assert parse("--kv-events-address", "tcp://*:5557").events_endpoint() == ("0.0.0.0", 5557)


def test_sglangs_compact_json_flag_reaches_every_replica():
    assert not parse().constrained_json_disable_any_whitespace  # free whitespace, as SGLang's default
    args = parse("--constrained-json-disable-any-whitespace", "--dp-size", "2")
    assert args.constrained_json_disable_any_whitespace
    assert "--constrained-json-disable-any-whitespace" in replica_argv(args, exclude=("dp_size",))


def test_the_command_says_its_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"radixcluster {__version__}"


@pytest.mark.parametrize(
    "argv, error",
    [
        (["up", "--port", "30000", "--is-embedding"], "radixcluster up: error: unrecognized arguments: --is-embedding"),
        (["up", "--grammar-backend", "outlines"], "radixcluster up: error: argument --grammar-backend: invalid choice"),
        (["gateway", "--replica", "http://h:1", "--bogus"], "radixcluster gateway: error: unrecognized arguments"),
    ],
)
def test_a_bad_flag_is_named_under_a_short_usage(capsys, argv: list[str], error: str) -> None:
    """The subcommand names the flag it did not take, under one usage line rather than argparse's
    listing of every flag."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    command = argv[0]
    usage = f"usage: radixcluster {command} [flags] (radixcluster {command} --help lists them)"
    lines = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and len(lines) == 2 and lines[0] == usage and lines[1].startswith(error)


def test_a_free_port_is_one_the_os_hands_nobody_meanwhile():
    """Outside the kernel's ephemeral range and Ray's worker ports, and nothing listens on it."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(20)}
    assert all(p in UNASSIGNED_PORTS and not low <= p <= high and not 10002 <= p <= 19999 for p in ports)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        assert taken.getsockname()[1] not in {free_port() for _ in range(50)}


def test_the_commands_own_lines_survive_a_reader_that_went_away():
    """`radixcluster up 2>&1 | head -1` ended the server at its next line: the write's broken pipe
    was raised."""
    script = (
        "import time\ntime.sleep(0.5)\nfrom radixcluster.server_args import say\nsay('one')\nsay('two')\nprint('on')"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child.stderr.close()  # the reader goes away before the lines come
    assert child.stdout.read() == "on\n" and child.wait(timeout=60) == 0
