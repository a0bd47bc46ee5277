"""Sizing a replica: dtype by device, weights, KV pages from memory, a container's memory and CPU
limits read from cgroup (v1 and v2) files, and CPUs per rank from the affinity set and the quota
(pure functions; cgroup trees are real files under tmp_path)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixcluster.cli import main
from radixcluster.model_config import load_model_config
from radixcluster.model_path import INDEX_FILE, ModelPathError, resolve_model_path, resolve_tokenizer_path
from radixcluster.replica_plan import (
    DTYPE_BYTES,
    CpuPlan,
    available_memory_bytes,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    check_rank_memory,
    check_tokenizer_fits,
    check_weight_format,
    choose_context_length,
    choose_dtype,
    choose_kv_cache_dtype,
    machine_cpus,
    make_plan,
    mem_fraction,
    memory_bytes,
    omp_env,
    packed_weight_bytes,
    plan_cpus,
    plan_kv_pages,
    pool_past_available,
    prepacks_weights,
    replicas_past_available,
    weight_bytes,
)
from radixcluster.server_args import ServerArgs

GIB = 2**30


@pytest.fixture(scope="module")
def cfg(model_path):
    return load_model_config(model_path)


def test_dtype_auto_is_exact_on_cpu_and_fast_on_gpu():
    assert choose_dtype("auto", "cpu") == "float32"
    assert choose_dtype("auto", "cuda") == "bfloat16"
    assert choose_dtype("bfloat16", "cpu") == "bfloat16"
    assert choose_dtype("half", "cuda") == "float16" and choose_dtype("float", "cpu") == "float32"
    for half in ("float16", "half"):  # the CPU's kernels compute in float32 and bfloat16
        with pytest.raises(ValueError, match=f"--dtype {half} runs on CUDA only"):
            choose_dtype(half, "cpu")


def test_weight_bytes_count_every_parameter_of_smollm2(cfg):
    # 30 layers x 3,538,944 linear parameters + a tied 49,152 x 576 embedding
    assert weight_bytes(cfg, 4) == (30 * 3_538_944 + 49_152 * 576) * 4


def test_cpu_pool_is_a_fifth_of_ram_after_the_weights(cfg):
    # 0.2 x 4 GiB - 538 MB of fp32 weights, at 46,080 bytes of K and V per token
    assert plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 4 * GIB) == 6967
    assert plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 16 * GIB) == 62891


def test_pages_hold_tokens_of_the_page_size(cfg):
    tokens = plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 8 * GIB)
    assert plan_kv_pages(ServerArgs(page_size=16), cfg, "cpu", 4, 8 * GIB) == tokens // 16


def test_a_pool_too_small_names_the_flag_that_made_it_so(cfg):
    with pytest.raises(ValueError, match="--mem-fraction-static 0.0001 leaves no room"):
        plan_kv_pages(ServerArgs(mem_fraction_static=0.0001), cfg, "cpu", 4, 4 * GIB)
    tokens = plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 4 * GIB)
    with pytest.raises(ValueError, match=f"--page-size 100000: the KV cache holds {tokens} tokens, not two pages"):
        plan_kv_pages(ServerArgs(page_size=100_000), cfg, "cpu", 4, 4 * GIB)


def test_cpu_ranks_share_one_ram_and_gpu_ranks_have_their_own(cfg):
    one = plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 16 * GIB)
    three = plan_kv_pages(ServerArgs(tp_size=3), cfg, "cpu", 4, 16 * GIB)
    assert three == one  # each CPU rank gets a third of the RAM for a third of the weights and KV heads
    gpu_one = plan_kv_pages(ServerArgs(), cfg, "cuda", 2, 16 * GIB)
    gpu_three = plan_kv_pages(ServerArgs(tp_size=3), cfg, "cuda", 2, 16 * GIB)
    assert gpu_three > gpu_one  # every GPU holds a shard of the weights and a third of the heads


def test_packed_weights_are_the_linear_layers_and_one_lm_head(cfg):
    assert packed_weight_bytes(cfg, 4) == (30 * 3_538_944 + 49_152 * 576) * 4
    assert packed_weight_bytes(cfg, 2) == (30 * 3_538_944 + 49_152 * 576) * 2


def test_prepacked_copies_come_out_of_the_kv_pool(cfg):
    plain = plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 16 * GIB)
    packed = plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 16 * GIB, prepack=True)
    assert plain - packed == pytest.approx(packed_weight_bytes(cfg, 4) / cfg.kv_bytes_per_token(1, 4), abs=1)


def test_cpu_prepacks_unless_disabled_or_short_of_memory(cfg):
    assert prepacks_weights(ServerArgs(), cfg, "cpu", 4, 24 * GIB)
    assert not prepacks_weights(ServerArgs(disable_weight_prepack=True), cfg, "cpu", 4, 24 * GIB)
    assert not prepacks_weights(ServerArgs(), cfg, "cuda", 2, 80 * GIB)
    # 0.2 x 4 GiB leaves 321 MB after the 538 MB of weights: the 538 MB copy would not fit
    assert not prepacks_weights(ServerArgs(), cfg, "cpu", 4, 4 * GIB)


def test_max_total_tokens_overrides_memory(cfg):
    args = ServerArgs(max_total_tokens=3000, page_size=16)
    assert plan_kv_pages(args, cfg, "cpu", 4, 1 * GIB) == 3000 // 16


def test_bf16_holds_twice_the_tokens_per_byte(cfg):
    fp32 = plan_kv_pages(ServerArgs(mem_fraction_static=0.5), cfg, "cpu", DTYPE_BYTES["float32"], 8 * GIB)
    bf16 = plan_kv_pages(ServerArgs(mem_fraction_static=0.5), cfg, "cpu", DTYPE_BYTES["bfloat16"], 8 * GIB)
    assert bf16 > 2 * fp32  # the weights shrink too


def test_the_context_length_is_the_models_or_a_shorter_one(cfg, caplog):
    assert choose_context_length(None, cfg) == cfg.max_position_embeddings
    assert choose_context_length(1024, cfg) == 1024
    with pytest.raises(ValueError, match=r"exceeds the model's 8192 \(max_position_embeddings\)"):
        choose_context_length(10**9, cfg)  # it allocated 256 GB of page tables
    assert not caplog.records
    # a sliding window this engine does not apply: the context stops there, and says so
    sliding = dataclasses.replace(cfg, sliding_window=4096)
    assert choose_context_length(None, sliding) == 4096
    assert "slides over 4096 tokens" in caplog.text
    with pytest.raises(ValueError, match=r"exceeds the model's 4096 \(its sliding window\)"):
        choose_context_length(8192, sliding)


def test_a_pool_or_page_tables_beyond_a_ranks_memory_are_refused_before_anything_starts(cfg):
    args = ServerArgs(max_running_requests=64)
    check_rank_memory(args, cfg, "cpu", 4, 4, 86_000, 8192, 8 * GIB)  # the default plan: 0.5 + 3.7 GiB + 2 MiB
    with pytest.raises(ValueError, match=r"page tables \(30517.6 GiB"):
        check_rank_memory(ServerArgs(max_running_requests=10**9), cfg, "cpu", 4, 4, 86_000, 8192, 8 * GIB)
    with pytest.raises(ValueError, match=r"weights \(0.5 GiB\), KV pool \(7.7 GiB"):  # 7.7 alone would fit in 8
        check_rank_memory(args, cfg, "cpu", 4, 4, 180_000, 8192, 8 * GIB)
    with pytest.raises(ValueError, match="exceed its 4.0 GiB"):  # two CPU ranks share the host's 8
        check_rank_memory(ServerArgs(tp_size=2), cfg, "cpu", 4, 4, 400_000, 8192, 8 * GIB)
    check_rank_memory(ServerArgs(tp_size=2), cfg, "cuda", 4, 4, 400_000, 8192, 8 * GIB)  # a GPU each: 5.7 GiB


def test_the_kv_cache_is_the_models_dtype_unless_fp8_is_asked(cfg):
    assert choose_kv_cache_dtype("auto", "bfloat16") == "bfloat16"
    assert choose_kv_cache_dtype("fp8_e4m3", "float32") == "float8_e4m3fn"
    assert choose_kv_cache_dtype("fp8_e5m2", "bfloat16") == "float8_e5m2"


def test_an_fp8_cache_holds_four_times_fp32s_tokens_in_the_same_memory(cfg):
    args = ServerArgs(mem_fraction_static=0.5)
    fp32 = plan_kv_pages(args, cfg, "cpu", DTYPE_BYTES["float32"], 8 * GIB)
    fp8 = plan_kv_pages(args, cfg, "cpu", DTYPE_BYTES["float32"], 8 * GIB, kv_dtype_bytes=DTYPE_BYTES["float8_e4m3fn"])
    assert fp8 // 4 == fp32  # the weights stay float32


def test_vllms_gpu_memory_utilization_sizes_a_gpu_pool_only(cfg):
    vllm = ServerArgs(gpu_memory_utilization=0.5)
    assert (mem_fraction(vllm, "cuda"), mem_fraction(vllm, "cpu")) == (0.5, 0.2)  # vLLM-CPU ignores it too
    assert plan_kv_pages(vllm, cfg, "cuda", 2, 16 * GIB) == plan_kv_pages(
        ServerArgs(mem_fraction_static=0.5), cfg, "cuda", 2, 16 * GIB
    )
    assert plan_kv_pages(vllm, cfg, "cpu", 4, 16 * GIB) == plan_kv_pages(ServerArgs(), cfg, "cpu", 4, 16 * GIB)


def test_load_format_and_quantization_must_name_the_model_paths_format(model_path: Path, tmp_path: Path):
    for args in (ServerArgs(), ServerArgs(load_format="gguf"), ServerArgs(quantization="gguf")):
        check_weight_format(args, model_path)
    check_weight_format(ServerArgs(load_format="safetensors"), tmp_path)
    with pytest.raises(ModelPathError, match="--load-format safetensors: the model path .* holds gguf weights"):
        check_weight_format(ServerArgs(load_format="safetensors"), model_path)
    with pytest.raises(ModelPathError, match="--load-format gguf: the model path .* holds safetensors weights"):
        check_weight_format(ServerArgs(load_format="gguf"), tmp_path)
    with pytest.raises(ModelPathError, match="--quantization gguf: the model path .* is not a GGUF file"):
        check_weight_format(ServerArgs(quantization="gguf"), tmp_path)


def test_no_room_after_the_weights_says_so(cfg):
    with pytest.raises(ValueError, match="no room for a KV cache"):
        plan_kv_pages(ServerArgs(mem_fraction_static=0.1), cfg, "cpu", 4, 2 * GIB)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture(scope="module")
def tokenizer_dir(hf_tokenizer, tmp_path_factory) -> Path:
    """A tokenizer alone, in Hugging Face's files (no config.json), as vLLM's --tokenizer takes one."""
    directory = tmp_path_factory.mktemp("tokenizer")
    hf_tokenizer.save_pretrained(directory)
    return directory


def test_a_tokenizer_path_is_a_tokenizer_directory_or_gguf_and_the_model_is_the_default(
    model_path: Path, tokenizer_dir: Path, tmp_path: Path
):
    assert resolve_tokenizer_path(None, model_path) == model_path
    assert resolve_tokenizer_path(str(tokenizer_dir), model_path) == tokenizer_dir
    assert resolve_tokenizer_path(str(model_path), tmp_path) == model_path
    # relative paths are made absolute: /model_info reports them to clients in other directories
    relative = os.path.relpath(tokenizer_dir)
    assert resolve_tokenizer_path(relative, model_path) == tokenizer_dir and not Path(relative).is_absolute()
    assert resolve_model_path(os.path.relpath(model_path)) == model_path
    for wrong in (tmp_path, tmp_path / "absent", tokenizer_dir / "tokenizer.json"):
        with pytest.raises(ModelPathError, match="neither a directory with tokenizer.json nor a .gguf file"):
            resolve_tokenizer_path(str(wrong), model_path)
    with pytest.raises(ModelPathError, match="neither"):
        ServerArgs(tokenizer_path=str(tmp_path))  # refused before anything starts


def test_a_tokenizer_with_ids_beyond_the_models_embedding_is_refused(cfg, tokenizer_dir: Path, tmp_path: Path):
    check_tokenizer_fits(tokenizer_dir, cfg)
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": cfg.vocab_size, "content": "<|extra|>"})
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelPathError, match=f"{cfg.vocab_size + 1} tokens, more than the model's {cfg.vocab_size}"):
        check_tokenizer_fits(tmp_path, cfg)


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree(tmp_path: Path):
    write(tmp_path / "memory.max", "max")
    write(tmp_path / "kubepods" / "memory.max", str(64 * GIB))
    write(tmp_path / "kubepods" / "pod1" / "memory.max", str(16 * GIB))
    write(tmp_path / "kubepods" / "pod1" / "c1" / "memory.max", "max")
    assert cgroup_memory_limit("0::/kubepods/pod1/c1\n", tmp_path) == 16 * GIB


def test_cgroup_v2_without_a_limit_is_none(tmp_path: Path):
    write(tmp_path / "user.slice" / "memory.max", "max")
    assert cgroup_memory_limit("0::/user.slice\n", tmp_path) is None


def test_a_container_reads_its_own_cgroup_at_the_mount_root(tmp_path: Path):
    """Without a cgroup namespace the path names the host's tree, which the container does not see."""
    write(tmp_path / "memory.max", str(4 * GIB))
    assert cgroup_memory_limit("0::/system.slice/docker-abc.scope\n", tmp_path) == 4 * GIB


def test_cgroup_v1_ignores_its_no_limit_number_and_other_controllers(tmp_path: Path):
    membership = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n"
    write(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    write(tmp_path / "memory" / "docker" / "abc" / "memory.limit_in_bytes", str(8 * GIB))
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "memory.limit_in_bytes", str(GIB))  # not memory's
    assert cgroup_memory_limit(membership, tmp_path) == 8 * GIB
    write(tmp_path / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712")
    assert cgroup_memory_limit(membership, tmp_path) is None


def test_no_cgroup_files_means_no_limit(tmp_path: Path):
    assert cgroup_memory_limit("", tmp_path) is None
    assert cgroup_memory_limit("0::/\n", tmp_path) is None


def test_the_pool_is_sized_from_the_container_limit_not_the_host(cfg, tmp_path: Path):
    """A 16 GiB pod on a 512 GiB node: the pool fits the pod."""
    write(tmp_path / "memory.max", str(16 * GIB))
    limit = cgroup_memory_limit("0::/\n", tmp_path)
    assert limit is not None
    args = ServerArgs()
    in_pod = plan_kv_pages(args, cfg, "cpu", 4, min(512 * GIB, limit))
    assert in_pod == plan_kv_pages(args, cfg, "cpu", 4, 16 * GIB) < plan_kv_pages(args, cfg, "cpu", 4, 512 * GIB)


def test_cgroup_v2_cpu_quota_is_the_tightest_up_the_tree(tmp_path: Path):
    write(tmp_path / "cpu.max", "max 100000")
    write(tmp_path / "kubepods" / "cpu.max", "800000 100000")
    write(tmp_path / "kubepods" / "pod1" / "cpu.max", "150000 100000")  # limits.cpu: 1500m
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", tmp_path) == 1.5
    write(tmp_path / "kubepods" / "pod1" / "cpu.max", "max 100000")
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", tmp_path) == 8.0


def test_cgroup_v1_cpu_quota_and_no_quota(tmp_path: Path):
    membership = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n"
    write(tmp_path / "cpu" / "docker" / "abc" / "cpu.cfs_quota_us", "200000")
    write(tmp_path / "cpu" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    write(tmp_path / "memory" / "docker" / "abc" / "cpu.cfs_quota_us", "10000")  # not cpu's
    assert cgroup_cpu_limit(membership, tmp_path) == 2.0
    write(tmp_path / "cpu" / "docker" / "abc" / "cpu.cfs_quota_us", "-1")
    assert cgroup_cpu_limit(membership, tmp_path) is None
    assert cgroup_cpu_limit("", tmp_path) is None


def test_this_process_uses_at_most_the_cpus_it_may_run_on():
    plan = machine_cpus(1)
    assert 1 <= plan.threads_per_rank <= plan.usable <= len(os.sched_getaffinity(0))


def test_each_rank_gets_its_own_cores_when_there_are_enough():
    assert plan_cpus({0, 1}, None, 1) == CpuPlan(2, [[0, 1]], 2)
    assert plan_cpus({3, 1, 2, 0}, None, 2) == CpuPlan(2, [[0, 1], [2, 3]], 4)
    assert plan_cpus(range(5), None, 2) == CpuPlan(2, [[0, 1], [2, 3]], 5)


def test_fewer_cores_than_ranks_run_one_unpinned_thread_each():
    assert plan_cpus({0, 1}, None, 3) == CpuPlan(1, None, 2)


def test_a_quota_caps_the_threads_and_pins_nothing():
    assert plan_cpus(range(64), 2.5, 1) == CpuPlan(2, None, 2)
    assert plan_cpus(range(64), 0.5, 2) == CpuPlan(1, None, 1)
    assert plan_cpus({0, 1}, 4.0, 1) == CpuPlan(2, [[0, 1]], 2)  # a quota above the cores changes nothing


@given(st.sets(st.integers(0, 255), min_size=1, max_size=64), st.integers(1, 8))
def test_pinned_ranks_never_share_a_core_and_match_their_thread_count(cpus, tp_size):
    plan = plan_cpus(cpus, None, tp_size)
    assert plan.threads_per_rank >= 1
    if plan.rank_cpus is not None:
        used = [cpu for rank in plan.rank_cpus for cpu in rank]
        assert len(used) == len(set(used)) and set(used) <= cpus
        assert all(len(rank) == plan.threads_per_rank for rank in plan.rank_cpus)


def test_omp_env_binds_one_thread_per_core():
    assert omp_env(2, [4, 5]) == {"OMP_NUM_THREADS": "2", "OMP_PLACES": "{4},{5}", "OMP_PROC_BIND": "close"}
    assert omp_env(1, None) == {"OMP_NUM_THREADS": "1"}


def test_the_memory_available_now_is_read_from_meminfo():
    meminfo = "MemTotal:       24663160 kB\nMemFree:         1203456 kB\nMemAvailable:    5242880 kB\n"
    assert available_memory_bytes(meminfo) == 5 * 2**30
    assert available_memory_bytes("MemTotal: 1 kB") is None
    assert 0 < available_memory_bytes(Path("/proc/meminfo").read_text()) <= memory_bytes("cpu")


def test_a_pool_past_what_the_host_has_free_is_warned_of():
    """The seeds' GPU line, --mem-fraction-static 0.8, on a 23.5 GiB host with 5 GiB free."""
    warning = pool_past_available(0.8 * 23.5 * 2**30, 5 * 2**30)
    assert "18.8 GiB" in warning and "5.0 GiB" in warning and "--mem-fraction-static" in warning
    assert pool_past_available(4 * 2**30, 5 * 2**30) is None
    assert pool_past_available(4 * 2**30, None) is None


def test_more_replicas_than_the_host_holds_the_weights_of_are_refused(capsys):
    """--dp-size 100 on a private Ray started replica after replica until the host ran out."""
    problem = replicas_past_available(100, 540 * 2**20, 20 * 2**30)
    assert problem.startswith("--dp-size 100: the replicas' weights alone take 52.7 GiB") and "--ray-address" in problem
    assert replicas_past_available(2, 540 * 2**20, 20 * 2**30) is None
    assert replicas_past_available(100, 540 * 2**20, None) is None
    assert main(["up", "--dp-size", "100000"]) == 2
    assert "radixcluster: error: --dp-size 100000: the replicas' weights alone take" in capsys.readouterr().err


def test_a_directory_without_its_weights_is_refused_before_anything_starts(hf_model_dir: Path, tmp_path: Path):
    """Not by a rank once the load began, after the start-up line said what is served."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_model_dir / name, tmp_path / name)
    with pytest.raises(ModelPathError, match=r"holds no \*.safetensors weights"):
        make_plan(ServerArgs(model_path=str(tmp_path)))
    shutil.copy(hf_model_dir / INDEX_FILE, tmp_path / INDEX_FILE)
    with pytest.raises(ModelPathError, match=r"lists shard\(s\) that do not exist: model-00001-of-"):
        make_plan(ServerArgs(model_path=str(tmp_path)))
