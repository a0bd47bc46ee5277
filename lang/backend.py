"""RuntimeEndpoint: the HTTP client of a radixcluster (or SGLang) server that programs run against."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from radixcluster.lang.chat_template import ChatTemplate, chat_template_for_model, get_chat_template

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


class ServerError(RuntimeError):
    """The server refused or failed a request; ``message`` is the server's own words."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"server error {status} from {url}: {message}")
        self.status = status
        self.message = message


class RuntimeEndpoint:
    """A server at ``base_url``. Thread-safe: programs run from many threads share one.

    Without ``chat_template`` (a name or a ChatTemplate; ``chat_template_name``, SGLang's
    keyword, names one too) the template is chosen from the served model's name, which makes
    the constructor ask the server for it.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 600.0,
        chat_template: str | ChatTemplate | None = None,
        chat_template_name: str | None = None,
    ) -> None:
        if chat_template is not None and chat_template_name is not None:
            raise ValueError("give chat_template or chat_template_name, not both")
        chat_template = chat_template if chat_template_name is None else chat_template_name
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        if isinstance(chat_template, str):
            chat_template = get_chat_template(chat_template)
        self.chat_template = chat_template or chat_template_for_model(self.server_info().get("served_model_name", ""))

    def server_info(self) -> dict[str, Any]:
        """``GET /get_server_info``."""
        return self._request("GET", "/get_server_info")

    get_server_info = server_info  # SGLang's RuntimeEndpoint name

    def get_model_name(self) -> str:
        """The path the server serves (``/get_model_info``'s ``model_path``), as SGLang names it."""
        return str(self._request("GET", "/get_model_info")["model_path"])

    def flush_cache(self) -> dict[str, Any]:
        """``POST /flush_cache``: empty the server's radix cache (refused while requests run)."""
        return self._request("POST", "/flush_cache")

    def generate(self, payload: dict[str, Any], session_id: str | None = None) -> Any:
        """``POST /generate`` with a native-API body; the decoded JSON answer (a list for a batch).
        ``session_id`` goes out as ``X-Session-Id``: a gateway keeps a session on one replica."""
        headers = {SESSION_HEADER: session_id} if session_id else None
        return self._request("POST", "/generate", payload, headers)

    def generate_stream(self, payload: dict[str, Any], session_id: str | None = None) -> Iterator[dict[str, Any]]:
        """``POST /generate`` with ``stream``: each event's answer so far (its ``text`` cumulative,
        as the native API streams it). An error event raises ServerError with its message."""
        headers = {SESSION_HEADER: session_id} if session_id else None
        url = f"{self.base_url}/generate"
        with self._reaching("/generate"):
            with self._client.stream(
                "POST", "/generate", json={**payload, "stream": True}, headers=headers
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ServerError(response.status_code, _error_message(response), url)
                for line in response.iter_lines():
                    data = line.removeprefix("data:").strip()
                    if not line.startswith("data:") or data == "[DONE]":
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        raise ServerError(int(event["error"].get("code", 500)), str(event["error"]["message"]), url)
                    yield event

    def cache_prefix(self, prefix_str: str) -> dict[str, Any]:
        """SGLang's name: ``warm(prefix_str)``."""
        return self.warm(prefix_str)

    def warm(self, text: str | None = None, input_ids: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        """``POST /cache/warm``: compute a prefix (``text`` as /generate tokenizes it, or
        ``input_ids``) into the server's radix cache without generating, so the requests that
        start with it (a system prompt, a few-shot header) find it cached."""
        return self._request("POST", "/cache/warm", _prefix(text, input_ids, fields))

    def pin(
        self, text: str | None = None, input_ids: list[int] | None = None, *, ttl_s: float, **fields: Any
    ) -> dict[str, Any]:
        """``POST /cache/pin``: warm the prefix and keep it from eviction for ``ttl_s`` seconds."""
        return self._request("POST", "/cache/pin", {**_prefix(text, input_ids, fields), "ttl_s": ttl_s})

    def unpin(self, text: str | None = None, input_ids: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        """``DELETE /cache/pin``: end a pin before its time."""
        return self._request("DELETE", "/cache/pin", _prefix(text, input_ids, fields))

    def evict(self, text: str | None = None, input_ids: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        """``POST /cache/evict``: free the cached pages under a prefix that no request is using."""
        return self._request("POST", "/cache/evict", _prefix(text, input_ids, fields))

    def close(self) -> None:
        self._client.close()

    def _request(
        self, method: str, path: str, payload: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> Any:
        with self._reaching(path):
            response = self._client.request(method, path, json=payload, headers=headers)
        if response.status_code >= 400:
            raise ServerError(response.status_code, _error_message(response), f"{self.base_url}{path}")
        return response.json()

    @contextmanager
    def _reaching(self, path: str) -> Iterator[None]:
        """Transport failures as the errors a program sees: TimeoutError, ConnectionError."""
        try:
            yield
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"no answer from {self.base_url}{path} within the timeout: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ConnectionError(f"cannot reach the server at {self.base_url}{path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r}, chat_template={self.chat_template.name!r})"


def _prefix(text: str | None, input_ids: list[int] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The body naming a prefix (the server says which of text and input_ids is wrong)."""
    given = {"text": text, "input_ids": input_ids}
    return {**{key: value for key, value in given.items() if value is not None}, **fields}


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return response.text.strip()
