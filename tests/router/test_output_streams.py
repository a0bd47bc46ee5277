"""What a finished request leaves in the prompt memo: its prompt + answer text with the ids that
spell it, and nothing when its ids do not spell its text (the real SmolLM2 tokenizer; the
answers' ids are set as a model's step would set them)."""

from __future__ import annotations

import numpy as np

from radixcluster.protocol import GenerateRequest, SamplingParams
from radixcluster.router.output_streams import OutputStreams
from radixcluster.router.request import ReqState, Request
from radixcluster.router.text.prompt_memo import PromptMemo
from radixcluster.router.text.tokenizer import load_tokenizer

PROMPT = "The capital of France is"


def finish(streams: OutputStreams, rid: str, prompt_ids: list[int], answer: list[int]) -> str:
    """The text ``answer`` streams as, once its request finished on length."""
    req = Request(rid, np.asarray(prompt_ids))
    streams.open(GenerateRequest(rid=rid, text=PROMPT, sampling=SamplingParams(temperature=0.0)), req, PROMPT)
    req.output_ids.extend(answer)
    req.state, req.finish_reason = ReqState.FINISHED, {"type": "length", "length": len(answer)}
    (out,) = streams.collect([req], scheduler=None)
    return out.text


def test_an_answer_is_remembered_only_when_its_ids_spell_it(model_path) -> None:
    tokenizer, memo = load_tokenizer(model_path), PromptMemo()
    streams = OutputStreams(tokenizer, memo)
    prompt_ids = tokenizer.encode(PROMPT)
    paris = tokenizer.encode(" Paris", add_special_tokens=False)
    assert finish(streams, "spelled", prompt_ids, paris) == " Paris"
    found = memo.longest_prefix(PROMPT + " Paris")
    assert found is not None and found[1].tolist() == prompt_ids + paris
    # a model whose embedding is padded past the tokenizer (as Qwen's are) may generate ids
    # without text: remembered, the prompt alone would come back with them glued on
    beyond = [tokenizer.vocab_size + 5, tokenizer.vocab_size + 9]
    assert finish(streams, "beyond", prompt_ids, beyond) == ""
    assert memo.longest_prefix(PROMPT) is None
