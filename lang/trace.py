"""The data a program builds as it runs (text, messages, variables) and the log of the
server requests it made, from which its cache hit rate is computed."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Trace:
    """One program's text so far. ``assigned`` names the variables set since this trace was
    made (a fork's own results); ``fork_offset`` is where its text left its parent's.
    ``streaming`` names the gen whose answer is arriving (its variable holds it so far), and
    ``changed`` is notified whenever the text grows, for those who read it as it streams."""

    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
    role: str | None = None  # the message open since text[role_start:]
    role_start: int = 0
    assigned: list[str] = field(default_factory=list)
    fork_offset: int = 0
    streaming: str | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)

    def assign(self, name: str | None, value: Any, meta_info: dict[str, Any]) -> None:
        if name is None:
            return
        self.variables[name] = value
        self.meta_info[name] = meta_info
        if name not in self.assigned:
            self.assigned.append(name)

    def touched(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def fork(self) -> Trace:
        return Trace(
            text=self.text,
            messages=[dict(m) for m in self.messages],
            variables=dict(self.variables),
            meta_info=dict(self.meta_info),
            role=self.role,
            role_start=self.role_start,
            fork_offset=len(self.text),
        )


class RequestLog:
    """Token counters of every /generate answer of a run (a program and its forks), and the
    run's session id: every request of the run carries it, so a gateway in front of several
    replicas sends them all to the one whose cache holds the run's growing prompt."""

    def __init__(self) -> None:
        self.session_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._prompt_tokens = 0
        self._cached_tokens = 0

    def record(self, meta_info: dict[str, Any]) -> None:
        with self._lock:
            self._prompt_tokens += int(meta_info.get("prompt_tokens", 0))
            self._cached_tokens += int(meta_info.get("cached_tokens", 0))

    def cache_hit_info(self) -> dict[str, Any]:
        """{total_tokens, cached_tokens, hit_rate}: prompt tokens sent, how many the server found
        in its radix cache, and their ratio."""
        with self._lock:
            total, cached = self._prompt_tokens, self._cached_tokens
        return {"total_tokens": total, "cached_tokens": cached, "hit_rate": cached / total if total else 0.0}
