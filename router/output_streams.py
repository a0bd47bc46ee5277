"""What each request sends back to the api: incremental text, stop strings, token counts and
logprobs, as RequestOutput deltas (when streaming: its first token at once, then every
``stream_interval`` tokens, the request's own or the server's; otherwise once at the end)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixcluster.protocol import GenerateRequest, RequestOutput
from radixcluster.router.request import Request
from radixcluster.router.text.detokenizer import INCOMPLETE, IncrementalDetokenizer, StopChecker
from radixcluster.router.text.prompt_memo import PromptMemo
from radixcluster.router.text.stop_regex import RegexStopChecker, StopRegexTimeout
from radixcluster.router.text.tokenizer import Tokenizer


@dataclass(slots=True)
class _Stream:
    request: Request
    stream: bool
    interval: int  # a streaming request's tokens per output after its first
    detok: IncrementalDetokenizer
    stops: StopChecker
    regexes: RegexStopChecker
    prompt_text: str | None
    skip_special: bool = True  # the text leaves special tokens out
    token_texts: bool = False  # logprob entries carry token text
    prompt_ids: bool = False  # the next output carries the prompt's ids (once)
    text: str = ""  # everything emitted so far
    sent_ids: int = 0
    sent_logprobs: int = 0
    sent_input_logprobs: bool = False
    first_token_at: float = 0.0  # time.monotonic() when its first token was out (0: not yet)
    # the deltas not sent yet: a non-streaming request's until it finishes, a streaming one's
    # until its stream interval's tokens are in
    held: RequestOutput | None = None

    @property
    def armed(self) -> bool:
        """Whether a stop may end it: not before min_new_tokens, as in SGLang and vLLM."""
        return len(self.request.output_ids) >= self.request.sampling.min_new_tokens

    def feed(self, delta: str) -> tuple[str, bool]:
        """Text to emit and whether a stop string or stop regex ended it."""
        armed = self.armed
        text, stopped = self.stops.feed(delta, armed)
        return (text, True) if stopped else self.regexes.feed(text, armed)

    def advance(self, tokenizer: Tokenizer) -> tuple[str, bool]:
        """Text to emit for the new ids and whether a stop ended it. A special token the text
        skips still ends it on a stop string it spells (``<|im_end|>``), as SGLang matches stop
        strings on the ids' text with special tokens spelled; what was held back goes out first."""
        ids = self.new_ids()
        hit = self._special_stop(ids, tokenizer) if self.skip_special and self.stops.stops and self.armed else None
        if hit is None:
            return self.feed(self.detok.add(ids))
        index, stop = hit
        text, stopped = self.feed(self.detok.add(ids[:index]))
        if not stopped:
            text += self.flush()
            self.stops.end(stop)
        return text, True

    def _special_stop(self, ids: list[int], tokenizer: Tokenizer) -> tuple[int, str] | None:
        """The first of ``ids`` that is a special token spelling a stop string, and that string."""
        for index, token in enumerate(ids):
            if tokenizer.is_special(token):
                spelled = tokenizer.decode([token], skip_special_tokens=False)
                stop = next((s for s in self.stops.stops if s in spelled), None)
                if stop is not None:
                    return index, stop
        return None

    def new_ids(self) -> list[int]:
        """The ids whose text is still to come: its new ids, less the stop token that ended it
        (its text is left out unless no_stop_trim, as SGLang and vLLM leave it out)."""
        req = self.request
        ids = req.output_ids[self.sent_ids :]
        reason = req.finish_reason or {}
        if ids and reason.get("type") == "stop" and isinstance(reason.get("matched"), int):
            return ids if self.stops.no_stop_trim else ids[:-1]
        return ids

    def flush(self) -> str:
        """The rest of the text of a request that ended without a stop."""
        text, stopped = self.feed(self.detok.flush())
        return text if stopped else text + self.regexes.feed(self.stops.flush())[0]

    @property
    def matched(self) -> str | None:
        return self.stops.matched or self.regexes.matched


@dataclass(slots=True)
class OutputStreams:
    tokenizer: Tokenizer
    memo: PromptMemo
    stream_interval: int = 1
    generated_tokens_total: int = 0
    _streams: dict[str, _Stream] = field(default_factory=dict)

    def open(self, msg: GenerateRequest, request: Request, prompt_text: str | None) -> None:
        s = msg.sampling
        self._streams[msg.rid] = _Stream(
            request=request,
            stream=msg.stream,
            interval=s.stream_interval or self.stream_interval,
            detok=IncrementalDetokenizer(self.tokenizer, s.skip_special_tokens),
            stops=StopChecker(s.stop, s.no_stop_trim),
            regexes=RegexStopChecker(s.stop_regex),
            prompt_text=prompt_text,
            skip_special=s.skip_special_tokens,
            token_texts=msg.return_text_in_logprobs,
            prompt_ids=msg.return_prompt_ids,
        )

    def close(self, rid: str) -> None:
        self._streams.pop(rid, None)

    def rids(self) -> list[str]:
        return list(self._streams)

    def __contains__(self, rid: str) -> bool:
        return rid in self._streams

    def abort(self, rid: str, message: str, status: int = 200) -> RequestOutput:
        """The last output of a request ended from outside (client gone, shutdown, worker error)."""
        stream = self._streams.pop(rid)
        out = self._delta(stream, "")
        out.finished = True
        out.finish_reason = {"type": "abort", "message": message}
        if status != 200:
            out.error, out.status = message, status
        return out

    def collect(self, updated: list[Request], scheduler: Any) -> list[RequestOutput]:
        """Outputs for the requests a step advanced; applies stop strings through
        ``scheduler.finish_request``. A stop_regex that takes too long to search ends its own
        request with a 400 (its pages go back through ``scheduler.abort_request``)."""
        outputs = []
        for req in updated:
            stream = self._streams.get(req.rid)
            if stream is None:
                continue
            try:
                text, stopped = stream.advance(self.tokenizer)
                if req.finished and not stopped:
                    text += stream.flush()
            except StopRegexTimeout as exc:
                scheduler.abort_request(req.rid, str(exc))
                outputs.append(self.abort(req.rid, str(exc), 400))
                continue
            if stopped and not req.finished:
                scheduler.finish_request(req.rid, {"type": "stop", "matched": stream.matched})
            out = self._delta(stream, text)
            if req.finished:
                del self._streams[req.rid]
                out.finished, out.finish_reason = True, req.finish_reason
                if not stopped:
                    self._remember(stream)
            # the held delta holds every id sent so far when none went to the api yet
            first = len(out.output_ids) == stream.sent_ids
            if out.finished or (stream.stream and len(out.output_ids) >= (1 if first else stream.interval)):
                outputs.append(out)
                stream.held = None
        return outputs

    def _delta(self, stream: _Stream, text: str) -> RequestOutput:
        """What is new since the last output, merged into what a non-streaming request holds."""
        req = stream.request
        new_ids = req.output_ids[stream.sent_ids :]
        self.generated_tokens_total += len(new_ids) if req.log_metrics else 0
        out = stream.held or RequestOutput(rid=req.rid)
        if new_ids and not stream.first_token_at:
            stream.first_token_at = time.monotonic()
        out.first_token_at = stream.first_token_at
        out.text += text
        stream.text += text
        out.output_ids.extend(new_ids)
        new_logprobs = req.output_logprobs[stream.sent_logprobs :]
        out.output_logprobs.extend(new_logprobs)
        prefill_done = bool(req.output_ids) or req.finished
        new_input: list[list[Any]] = []
        if req.logprob_start_len >= 0 and prefill_done and not stream.sent_input_logprobs:
            out.input_logprobs = new_input = _input_logprobs(req)
            if req.top_logprobs_num:
                out.input_top_logprobs = [None, *req.input_top_logprobs]  # the first token has no logprob
            stream.sent_input_logprobs = True
        if stream.token_texts:
            texts = self._token_texts(_entry_ids(new_input, out.input_top_logprobs, new_logprobs))
            out.token_texts.update(texts)
            out.partial_bytes.update(
                {t: list(self.tokenizer.token_bytes(t)) for t, text in texts.items() if INCOMPLETE in text}
            )
        if stream.prompt_ids:
            out.prompt_ids = req.prompt_ids.tolist()
            stream.prompt_ids = False
        out.prompt_tokens = req.prompt_len
        out.completion_tokens = len(req.output_ids)
        out.cached_tokens = req.cached_tokens
        out.pinned_tokens = req.pinned_tokens
        stream.sent_ids = len(req.output_ids)
        stream.sent_logprobs = len(req.output_logprobs)
        stream.held = out
        return out

    def _token_texts(self, ids: set[int]) -> dict[int, str]:
        """Each token's own text, special tokens spelled out (SGLang's return_text_in_logprobs)."""
        return {t: self.tokenizer.decode([t], skip_special_tokens=False) for t in ids}

    def _remember(self, stream: _Stream) -> None:
        """Memo the finished prompt + answer text with the ids that produced it, when the ids
        spell exactly that text (no stop string cut it, no special token hides in it)."""
        req = stream.request
        ids = list(req.output_ids)
        while ids and self.tokenizer.is_special(ids[-1]):
            ids.pop()  # an end-of-sequence token: no text, and the next turn's template closes the turn
        # ids past the tokenizer's vocabulary (a padded embedding's) have no text: remembered,
        # they would join the prompt's text as it is (its answer spelled "")
        vocab = self.tokenizer.vocab_size
        if stream.prompt_text is None or any(t >= vocab or self.tokenizer.is_special(t) for t in ids):
            return
        if self.tokenizer.decode(ids) != stream.text:
            return
        self.memo.remember(
            stream.prompt_text + stream.text,
            np.concatenate([req.prompt_ids, np.asarray(ids, dtype=np.int32)]),
            req.cache_salt,
        )


def _entry_ids(input_entries: list[list[Any]], input_tops: list[Any], output_entries: list[list[Any]]) -> set[int]:
    """Every token id the entries name: prompt and output tokens and their top alternatives."""
    ids = {tid for _, tid in input_entries}
    ids.update(tid for tops in input_tops if tops for _, tid in tops)
    for _, tid, tops in output_entries:
        ids.add(tid)
        ids.update(t for _, t in tops)
    return ids


def _input_logprobs(req: Request) -> list[list[Any]]:
    """SGLang's shape: [logprob, token id] per prompt token from logprob_start_len on; the first
    has no logprob (nothing before it was scored)."""
    start = req.logprob_start_len
    ids = req.prompt_ids.tolist()
    scored = [[lp, ids[start + 1 + i]] for i, lp in enumerate(req.input_logprobs)]
    return [[None, ids[start]], *scored]
