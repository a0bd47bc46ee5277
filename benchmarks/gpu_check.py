"""The accelerator checks a GPU session runs (prepared on a CPU-only machine, not yet run):
kernel accuracy, the embedded model served end to end at tp 1, and step timings.

Run on a CUDA machine: .venv/bin/python benchmarks/gpu_check.py [--port 30123]
1. tests/kernels on the GPU (Triton compiled, float32 against the torch reference; fp8 caches,
   their rounding included);
2. the Triton kernels in bfloat16 and float32 against a float64 dense reference, shared-prefix
   (cascade) decode groups included;
3. `radixcluster up --device cuda --attention-backend triton`, one /generate, one chat
   completion, and greedy text equal to the torch backend's;
4. decode ms/step at batch 1/8/64/256 (context 512) beside the HBM-bandwidth floor
   (weights + KV read once per step), and prefill tokens/s;
5. one layer's decode attention of 32 groups x 8 requests sharing 1,984 of 2,048 tokens, with
   the cascade (shared prefix read once per group) against without.
Prints one line per check; exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from radixcluster.kernels.attention import build_attention_metadata  # noqa: E402
from radixcluster.kernels.triton_attention import triton_paged_attention  # noqa: E402
from radixcluster.kernels.triton_kv_store import triton_store_kv  # noqa: E402
from radixcluster.model_path import embedded_model_path  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from support.paged_batches import Extend, PageBook  # noqa: E402
from support.paged_case import Case  # noqa: E402

HBM_BYTES_PER_S = 4.8e12  # H200 peak; the floor is this over the bytes one step must read
# (requests' (prefix, new) lengths, shared-prefix groups)
BATCHES = [
    ([(0, 300)], []),
    ([(37, 129)], []),
    ([(4000, 1)] * 4, []),
    ([(0, 33), (511, 1), (64, 64), (1023, 1), (17, 2)], []),
    ([(700, 1)] * 6 + [(900, 1)] * 3, [([0, 1, 2, 3, 4, 5], 688), ([6, 7], 896)]),
]
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def check_kernels_against_float64() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for lens, groups in BATCHES:
            for page_size in (1, 16):
                case = Case(lens, page_size, 9, 3, head_dim=64, dtype=torch.float64, device="cuda", groups=groups)
                # the reference sees the inputs as rounded to dtype: only the kernels' error is left
                _cast(case, lambda x, dtype=dtype: x.to(dtype).double())
                expected = case.expected()
                _cast(case, lambda x, dtype=dtype: x.to(dtype))
                got = case.run(triton_store_kv, triton_paged_attention, gather_rows=False).double()
                err = float((got - expected).abs().max())
                assert err < TOLERANCE[dtype], f"{dtype} {lens} page {page_size}: max error {err}"
        print(f"kernels {dtype} vs float64: ok")


def _cast(case: Case, fn) -> None:
    case.k_cache, case.v_cache = fn(case.k_cache), fn(case.v_cache)
    case.k, case.v, case.q = ([fn(x) for x in xs] for xs in (case.k, case.v, case.q))


def check_server(port: int) -> None:
    texts = {}
    for backend in ("triton", "torch"):
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixcluster",
                "up",
                "--device",
                "cuda",
                "--port",
                str(port),
                "--attention-backend",
                backend,
                "--page-size",
                "16",
            ],
            cwd=ROOT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url)
            body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
            texts[backend] = httpx.post(f"{url}/generate", json=body, timeout=120).json()["text"]
            chat = httpx.post(
                f"{url}/v1/chat/completions",
                timeout=120,
                json={"model": "default", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 16},
            )
            assert chat.status_code == 200, chat.text
        finally:
            server.terminate()
            server.wait(60)
    print(f"served at tp 1: triton {texts['triton']!r}, torch {texts['torch']!r}")
    assert texts["triton"] == texts["torch"], "greedy text differs between backends"


def _wait_healthy(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")


def time_steps(context: int = 512, decode_steps: int = 32) -> None:
    path = embedded_model_path()
    max_batch = 256
    config = RunnerConfig(
        model_path=path,
        num_pages=max_batch * (context + decode_steps) // 16 + 2 * max_batch,
        page_size=16,
        max_slots=max_batch,
        max_context_len=context + decode_steps,
        device="cuda",
    )
    runner = ModelRunner(config)
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    cfg = runner.model_config
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * runner.dtype.itemsize
    for batch in (1, 8, 64, 256):
        book = PageBook(16, config.num_pages)
        prompts = torch.randint(3, cfg.vocab_size, (batch, context)).tolist()
        runner.forward(book.batch([Extend(s, p, 0) for s, p in enumerate(prompts)]))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for step in range(decode_steps):
            runner.forward(book.batch([Extend(s, [5], context + step) for s in range(batch)]))
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / decode_steps * 1e3
        floor = (weight_bytes + batch * (context + decode_steps // 2) * kv_bytes_per_token) / HBM_BYTES_PER_S * 1e3
        print(f"decode batch {batch:3d} context {context}: {ms:.2f} ms/step, bandwidth floor {floor:.3f} ms")
    book = PageBook(16, config.num_pages)
    prompts = torch.randint(3, cfg.vocab_size, (16, context)).tolist()
    torch.cuda.synchronize()
    start = time.perf_counter()
    runner.forward(book.batch([Extend(s, p, 0) for s, p in enumerate(prompts)]))
    torch.cuda.synchronize()
    print(f"prefill {16 * context} tokens: {16 * context / (time.perf_counter() - start):.0f} tokens/s")


def time_cascade(groups: int = 32, per_group: int = 8, context: int = 2048, shared: int = 1984) -> None:
    batch, heads, kv_heads, head_dim = groups * per_group, 9, 3, 64
    rows = groups * shared + batch * (context - shared + 1) + 1
    k, v = (torch.randn(rows, 1, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = torch.zeros(batch, context + 1, dtype=torch.int32)
    own = context + 1 - shared
    for b in range(batch):
        table[b, :shared] = torch.arange(1 + (b // per_group) * shared, 1 + (b // per_group + 1) * shared)
        table[b, shared:] = torch.arange(1 + groups * shared + b * own, 1 + groups * shared + (b + 1) * own)
    q = torch.randn(batch, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    prefix, new = torch.full((batch,), context), torch.ones(batch, dtype=torch.int64)
    group_of = torch.arange(batch).div(per_group, rounding_mode="floor").to(torch.int32).numpy()
    lens = torch.full((groups,), shared, dtype=torch.int32).numpy()
    ms, outs = {}, {}
    for name, sharing in (("cascade", (group_of, lens)), ("per request", (None, None))):
        meta = build_attention_metadata(
            table, prefix, new, 1, "cuda", gather_rows=False, shared_groups=sharing[0], shared_lens=sharing[1]
        )
        out = triton_paged_attention(q, k, v, meta, head_dim**-0.5)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            triton_paged_attention(q, k, v, meta, head_dim**-0.5)
        torch.cuda.synchronize()
        ms[name] = (time.perf_counter() - start) / 20 * 1e3
        outs[name] = out.float()
    err = float((outs["cascade"] - outs["per request"]).abs().max())
    assert err < 3e-2, f"cascade and per-request decode differ by {err}"
    print(
        f"decode attention, {groups} x {per_group} requests sharing {shared} of {context} tokens (bf16): "
        f"cascade {ms['cascade']:.3f} ms, per request {ms['per request']:.3f} ms "
        f"({ms['per request'] / ms['cascade']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=30123)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA device")
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "tests/kernels"], cwd=ROOT, env=env, check=True)
    check_kernels_against_float64()
    check_server(args.port)
    time_steps()
    time_cascade()


if __name__ == "__main__":
    main()
