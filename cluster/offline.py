"""`radixcluster generate`: the router's request handling and one in-process model runner, no
sockets and no server: for a quick check that a model loads and answers."""

from __future__ import annotations

import uuid

from radixcluster.model_config import load_model_config
from radixcluster.model_path import resolve_model_path, served_model_name
from radixcluster.protocol import ForwardBatch, GenerateRequest, RequestOutput, SamplingParams, StepResult
from radixcluster.router.router_process import Router, RouterConfig
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig

OFFLINE_PAGES = 8192  # one prompt plus its answer, with room to spare


def generate(prompt: str, model_path: str | None, max_new_tokens: int, temperature: float, chat: bool = True) -> str:
    """The completion of one prompt (chat-templated unless ``chat`` is False); ValueError for a
    request the router refuses, before the weights load."""
    path = resolve_model_path(model_path)
    context = load_model_config(path).context_limit
    router = Router(
        RouterConfig(
            model_path=path,
            served_model_name=served_model_name(path),
            num_pages=OFFLINE_PAGES,
            page_size=1,
            context_length=context,
            max_running_requests=1,
            chunked_prefill_size=2048,
            schedule_policy="fcfs",
            eviction_policy="lru",
            enable_radix_cache=True,
            tp_size=1,
            device="cpu",
            dtype="float32",
            max_queued_requests=1,
        )
    )
    request = GenerateRequest(
        rid=uuid.uuid4().hex,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
        messages=[{"role": "user", "content": prompt}] if chat else None,
        text=None if chat else prompt,
    )

    outputs = [out for out in router.submit(request) if isinstance(out, RequestOutput)]
    _raise_errors(outputs)
    runner = ModelRunner(
        RunnerConfig(model_path=path, num_pages=OFFLINE_PAGES, page_size=1, max_slots=1, max_context_len=context)
    )

    def execute(batch: ForwardBatch) -> StepResult:
        result = runner.step(batch)
        assert result is not None, "a single rank is rank 0: it samples"
        return result

    while not any(out.finished for out in outputs):
        outputs += router.step(execute)
    _raise_errors(outputs)
    return "".join(out.text for out in outputs)


def _raise_errors(outputs: list[RequestOutput]) -> None:
    errors = [out.error for out in outputs if out.error]
    if errors:
        raise ValueError(errors[0])
