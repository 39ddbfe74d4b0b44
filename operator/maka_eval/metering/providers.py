"""Provider endpoints: which requests are model requests, the web tools stripped from
them, and the usage read from their responses.

Three API shapes cover the providers a subject calls: OpenAI chat completions and
Responses (OpenAI, DeepSeek, and every OpenAI-compatible server), and Anthropic
messages (Anthropic, and DeepSeek's Anthropic-compatible path). An endpoint is told by
its method and path, so a subject's own base URL is metered too; the host only names
the provider.

Benchmark subjects never see provider web tools: WebSearch, WebFetch and FetchURL as
function tools (names compared without case, '_' or '-'), OpenAI's hosted `web_search*`
tools and Anthropic's `web_search_*` / `web_fetch_*` server tools are removed from the
JSON request, and a tool_choice that names a removed tool is fixed up.

Usage is read from a non-streaming JSON body, or incrementally from a server-sent event
stream (OpenAI chat: the chunk with `usage`, sent when stream_options.include_usage;
Responses: the `response.completed` event; Anthropic: message_start + message_delta).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from maka_eval import strict_json
from maka_eval.engine.usage import MAX_TOKENS, Usage
from maka_eval.metering.sse import SSEEvent, SSEParser

MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
"""A non-streaming response body larger than this is passed on but not read for usage."""
_WEB_NAME = re.compile(r"web[\s_\-]*(?:search|fetch)|fetch[\s_\-]*url", re.IGNORECASE | re.ASCII)
"""WebSearch, WebFetch, FetchURL, and their spellings with '_', '-' or spaces."""
_WEB_TYPE = re.compile(r"^(web_search|web_fetch)")
_MAYBE_WEB = re.compile(rb"web[\s_\-]*(?:search|fetch)|fetch[\s_\-]*url|\\u", re.IGNORECASE)
"""Found in the raw body of every request that names a web tool (a JSON \\u escape,
which could spell one, counts too): a body without it is forwarded unparsed."""


class Api(StrEnum):
    """The request/response shape of a model endpoint."""

    CHAT = "openai-chat"
    RESPONSES = "openai-responses"
    MESSAGES = "anthropic-messages"


@dataclass(frozen=True)
class Endpoint:
    """A model endpoint: its shape and the provider that serves it."""

    api: Api
    provider: str
    """'openai', 'anthropic', 'deepseek', or '<shape>-compatible' for another host."""


_PATHS = (
    (re.compile(r"(?:^|/)chat/completions/?$"), Api.CHAT),
    (re.compile(r"(?:^|/)responses/?$"), Api.RESPONSES),
    (re.compile(r"(?:^|/)messages/?$"), Api.MESSAGES),
)
_HOSTS = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "api.deepseek.com": "deepseek",
}


def detect_endpoint(method: str, host: str, path: str) -> Endpoint | None:
    """The model endpoint a request is for, or None (it is not a model request)."""
    if method.upper() != "POST":
        return None
    bare = path.split("?", 1)[0].split("#", 1)[0]
    for pattern, api in _PATHS:
        if pattern.search(bare):
            provider = _HOSTS.get(host.lower().rstrip("."))
            if provider is None:
                family = "anthropic" if api is Api.MESSAGES else "openai"
                provider = f"{family}-compatible"
            return Endpoint(api, provider)
    return None


# -- web-tool stripping -------------------------------------------------------------
def _is_web_name(name: Any) -> bool:
    return isinstance(name, str) and _WEB_NAME.fullmatch(name.strip()) is not None


def _tool_name(tool: Mapping[str, Any]) -> str | None:
    function = tool.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return str(function["name"])
    name = tool.get("name")
    return name if isinstance(name, str) else None


def _is_web_tool(tool: Any) -> bool:
    if not isinstance(tool, Mapping):
        return False
    kind = tool.get("type")
    if isinstance(kind, str) and _WEB_TYPE.match(kind):
        return True  # OpenAI hosted web_search*, Anthropic web_search_* / web_fetch_*
    return _is_web_name(_tool_name(tool))


def _label(tool: Mapping[str, Any]) -> str:
    name = _tool_name(tool)
    kind = tool.get("type")
    if name and isinstance(kind, str) and kind not in ("function", "custom"):
        return f"{kind}:{name}"[:80]
    return str(name or kind or "?")[:80]


def _choice_removed(choice: Any, removed_names: set[str], removed_types: set[str]) -> bool:
    """Whether a tool_choice names a removed tool (by name or by hosted-tool type)."""
    if isinstance(choice, Mapping):
        name = _tool_name(choice)
        if name is not None and (name in removed_names or _is_web_name(name)):
            return True
        kind = choice.get("type")
        if isinstance(kind, str) and (kind in removed_types or _WEB_TYPE.match(kind)):
            return True
    return False


@dataclass(frozen=True)
class Stripped:
    """A request body after web-tool stripping."""

    body: bytes | None
    """The new body, or None when nothing was removed (send the original bytes)."""
    removed: tuple[str, ...]
    """What was removed (tool names or types)."""


def _strip(obj: dict[str, Any]) -> list[str]:
    """Remove web tools from a decoded request in place; return what was removed."""
    removed: list[str] = []
    removed_names: set[str] = set()
    removed_types: set[str] = set()
    tools_emptied = False
    tools = obj.get("tools")
    if isinstance(tools, list):
        kept = []
        for tool in tools:
            if _is_web_tool(tool):
                removed.append(_label(tool))
                name = _tool_name(tool)
                if name:
                    removed_names.add(name)
                kind = tool.get("type")
                if isinstance(kind, str) and _WEB_TYPE.match(kind):
                    removed_types.add(kind)
            else:
                kept.append(tool)
        if len(kept) != len(tools):
            if kept:
                obj["tools"] = kept
            else:
                # An empty list is refused by some providers: no tools at all instead.
                del obj["tools"]
                tools_emptied = True
    functions = obj.get("functions")  # OpenAI's legacy function calling
    if isinstance(functions, list):
        kept_functions = [f for f in functions if not _is_web_name(_name_of(f))]
        for f in functions:
            if _is_web_name(_name_of(f)):
                removed.append(str(_name_of(f))[:80])
                removed_names.add(str(_name_of(f)))
        if len(kept_functions) != len(functions):
            if kept_functions:
                obj["functions"] = kept_functions
            else:
                del obj["functions"]
    call = obj.get("function_call")
    if isinstance(call, Mapping) and _is_web_name(call.get("name")):
        if obj.get("functions"):
            obj["function_call"] = "auto"
        else:
            del obj["function_call"]
    if not removed:
        return removed
    _fix_tool_choice(obj, removed_names, removed_types, tools_emptied)
    include = obj.get("include")
    if isinstance(include, list) and removed_types:
        # Responses: asking to include web_search_call output without the tool is refused.
        obj["include"] = [
            i for i in include if not (isinstance(i, str) and i.startswith("web_search_call"))
        ]
        if not obj["include"]:
            del obj["include"]
    return removed


def _name_of(function: Any) -> Any:
    return function.get("name") if isinstance(function, Mapping) else None


def _fix_tool_choice(
    obj: dict[str, Any], names: set[str], types: set[str], tools_emptied: bool
) -> None:
    if tools_emptied:
        # No tools left: a tool choice or parallel-call setting would be refused.
        obj.pop("tool_choice", None)
        obj.pop("parallel_tool_calls", None)
        return
    choice = obj.get("tool_choice")
    if _choice_removed(choice, names, types):
        # Anthropic's choices are typed ({"type": "tool", "name": ...}); OpenAI's take "auto".
        typed = isinstance(choice, Mapping) and choice.get("type") == "tool"
        obj["tool_choice"] = {"type": "auto"} if typed else "auto"
    elif isinstance(choice, Mapping) and isinstance(choice.get("tools"), list):
        # Responses' {"type": "allowed_tools", "tools": [...]}: drop removed entries.
        allowed = [t for t in choice["tools"] if not _choice_removed(t, names, types)]
        if not allowed:
            obj["tool_choice"] = "auto"
        elif len(allowed) != len(choice["tools"]):
            obj["tool_choice"] = {**choice, "tools": allowed}


def strip_web_tools(body: bytes) -> Stripped:
    """Remove provider web tools from a JSON request body (any of the three shapes).

    A body that is not a JSON object is left alone. Nothing removed: the original bytes
    are kept (body None), so an untouched request is forwarded byte for byte. A body
    that cannot name a web tool is not even parsed (a long conversation is large).
    """
    if _MAYBE_WEB.search(body) is None:
        return Stripped(None, ())
    try:
        obj = strict_json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Stripped(None, ())
    if not isinstance(obj, dict):
        return Stripped(None, ())
    removed = _strip(obj)
    if not removed:
        return Stripped(None, ())
    new = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Stripped(new, tuple(removed))


def looks_like_json_object(body: bytes) -> bool:
    """Whether a request body is (probably) a JSON object, without parsing it."""
    return body.lstrip()[:1] == b"{"


# -- usage -------------------------------------------------------------------------------
def _int(obj: Any, key: str) -> int | None:
    if not isinstance(obj, Mapping):
        return None
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        return None
    return value


def openai_chat_usage(usage: Any) -> Usage | None:
    """Chat completions usage (OpenAI, DeepSeek): prompt tokens include cached ones."""
    prompt = _int(usage, "prompt_tokens")
    completion = _int(usage, "completion_tokens")
    if prompt is None or completion is None:
        return None
    cached = _int(usage.get("prompt_tokens_details"), "cached_tokens")
    if cached is None:
        cached = _int(usage, "prompt_cache_hit_tokens")  # DeepSeek
    cached = min(cached or 0, prompt)
    return Usage(
        input_tokens=prompt - cached,
        cached_input_tokens=cached,
        cache_write_tokens=0,
        output_tokens=completion,
    )


def openai_responses_usage(usage: Any) -> Usage | None:
    """Responses usage: input tokens include cached ones."""
    given = _int(usage, "input_tokens")
    output = _int(usage, "output_tokens")
    if given is None or output is None:
        return None
    cached = min(_int(usage.get("input_tokens_details"), "cached_tokens") or 0, given)
    return Usage(given - cached, cached, 0, output)


def anthropic_usage(usage: Any) -> Usage | None:
    """Messages usage: input tokens exclude cache reads and writes."""
    given = _int(usage, "input_tokens")
    output = _int(usage, "output_tokens")
    if given is None or output is None:
        return None
    return Usage(
        input_tokens=given,
        cached_input_tokens=_int(usage, "cache_read_input_tokens") or 0,
        cache_write_tokens=_int(usage, "cache_creation_input_tokens") or 0,
        output_tokens=output,
    )


def usage_from_body(api: Api, obj: Any) -> Usage | None:
    """Usage of a whole (non-streaming) response object."""
    if not isinstance(obj, Mapping):
        return None
    if api is Api.CHAT:
        return openai_chat_usage(obj.get("usage"))
    if api is Api.RESPONSES:
        return openai_responses_usage(obj.get("usage"))
    return anthropic_usage(obj.get("usage"))


@dataclass(frozen=True)
class UsageReading:
    """What a response said about usage: the usage read (or None), whether it is the
    response's whole usage (a cut-off Anthropic stream gives a partial one), and the
    model the provider says served it (what it bills; None when it did not say)."""

    usage: Usage | None
    final: bool
    model: str | None = None


def _model(obj: Any) -> str | None:
    model = obj.get("model") if isinstance(obj, Mapping) else None
    return model if isinstance(model, str) and 0 < len(model) <= 128 else None


_RESPONSE_DONE = ("response.completed", "response.incomplete", "response.failed")


class _StreamUsage:
    """Usage from a server-sent event stream of one API shape."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.usage: Usage | None = None
        self.final = False
        self.model: str | None = None
        self._anthropic: dict[str, Any] = {}

    def event(self, event: SSEEvent) -> None:
        data = event.data
        if self.api is Api.CHAT:
            if '"usage"' not in data:
                return  # most chunks: not decoded at all
            obj = _decode(data)
            usage = openai_chat_usage(obj.get("usage")) if obj else None
            if usage is not None:
                self.usage, self.final = usage, True
                self.model = _model(obj) or self.model
        elif self.api is Api.RESPONSES:
            if event.event not in _RESPONSE_DONE and not any(t in data for t in _RESPONSE_DONE):
                return
            obj = _decode(data)
            if obj is None or obj.get("type") not in _RESPONSE_DONE:
                return
            response = obj.get("response")
            usage = openai_responses_usage(
                response.get("usage") if isinstance(response, Mapping) else None
            )
            if usage is not None:
                self.usage, self.final = usage, True
                self.model = _model(response) or self.model
        else:
            if event.event not in ("message_start", "message_delta") and (
                '"message_start"' not in data and '"message_delta"' not in data
            ):
                return
            obj = _decode(data)
            if obj is None:
                return
            if obj.get("type") == "message_start":
                message = obj.get("message")
                raw = message.get("usage") if isinstance(message, Mapping) else None
                self.model = _model(message) or self.model
                if isinstance(raw, Mapping):
                    self._anthropic = dict(raw)
                    self.usage = anthropic_usage(self._anthropic)
            elif obj.get("type") == "message_delta" and isinstance(obj.get("usage"), Mapping):
                # message_delta's counts are cumulative: they replace message_start's.
                merged = {
                    **self._anthropic,
                    **{k: v for k, v in obj["usage"].items() if v is not None},
                }
                usage = anthropic_usage(merged)
                if usage is not None:
                    self._anthropic = merged
                    self.usage, self.final = usage, True


def _decode(data: str) -> dict[str, Any] | None:
    try:
        obj = strict_json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class ResponseReader:
    """Reads usage from a response as its chunks pass: fed each chunk (a copy; the proxy
    forwards the original at once), asked for the reading when the response ends."""

    def __init__(self, api: Api, content_type: str, content_encoding: str = "") -> None:
        self.api = api
        self.streaming = content_type.split(";", 1)[0].strip().lower() == "text/event-stream"
        encoding = content_encoding.strip().lower()
        self._decoder: Any = None
        self.readable = True
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding not in ("", "identity"):
            self.readable = False  # an encoding the standard library cannot undo
        self._sse = SSEParser() if self.streaming else None
        self._stream = _StreamUsage(api) if self.streaming else None
        self._body = bytearray()
        self._too_big = False

    def feed(self, chunk: bytes) -> None:
        """Take a copy of the next chunk of the (encoded) body."""
        if not self.readable or not chunk:
            return
        if self._decoder is not None:
            try:
                chunk = self._decoder.decompress(chunk, MAX_JSON_BODY_BYTES)
            except zlib.error:
                self.readable = False
                return
        if self._sse is not None and self._stream is not None:
            for event in self._sse.feed(chunk):
                self._stream.event(event)
        elif not self._too_big:
            if len(self._body) + len(chunk) > MAX_JSON_BODY_BYTES:
                self._too_big = True
                self._body.clear()
            else:
                self._body += chunk

    def reading(self) -> UsageReading:
        """The usage read once the response has ended."""
        if not self.readable:
            return UsageReading(None, False)
        if self._stream is not None:
            return UsageReading(self._stream.usage, self._stream.final, self._stream.model)
        if self._too_big:
            return UsageReading(None, False)
        try:
            obj = strict_json.loads(bytes(self._body))
        except (ValueError, UnicodeDecodeError):
            return UsageReading(None, False)
        usage = usage_from_body(self.api, obj)
        return UsageReading(usage, usage is not None, _model(obj))
