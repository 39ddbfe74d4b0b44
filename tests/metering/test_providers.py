"""Provider endpoints, web-tool stripping and usage extraction for each shape."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from maka_eval.engine.usage import Usage
from maka_eval.metering.providers import (
    Api,
    Endpoint,
    ResponseReader,
    detect_endpoint,
    looks_like_json_object,
    strip_web_tools,
)
from tests.metering.provider_payloads import (
    Reported,
    chat_body,
    chat_stream,
    messages_body,
    messages_stream,
    responses_body,
    responses_stream,
)

R = Reported(prompt=1200, cached=200, output=345)


@pytest.mark.parametrize(
    ("method", "host", "path", "expected"),
    [
        ("POST", "api.openai.com", "/v1/chat/completions", Endpoint(Api.CHAT, "openai")),
        ("POST", "api.openai.com", "/v1/responses", Endpoint(Api.RESPONSES, "openai")),
        ("POST", "api.anthropic.com", "/v1/messages", Endpoint(Api.MESSAGES, "anthropic")),
        ("POST", "api.anthropic.com", "/v1/messages?beta=1", Endpoint(Api.MESSAGES, "anthropic")),
        ("POST", "api.deepseek.com", "/chat/completions", Endpoint(Api.CHAT, "deepseek")),
        ("POST", "api.deepseek.com", "/v1/chat/completions", Endpoint(Api.CHAT, "deepseek")),
        (
            "POST",
            "api.deepseek.com",
            "/anthropic/v1/messages",
            Endpoint(Api.MESSAGES, "deepseek"),
        ),
        (
            "POST",
            "example.openai.azure.com",
            "/openai/deployments/gpt/chat/completions?api-version=2024-10-21",
            Endpoint(Api.CHAT, "openai-compatible"),
        ),
        ("POST", "127.0.0.1", "/v1/messages", Endpoint(Api.MESSAGES, "anthropic-compatible")),
        ("GET", "api.openai.com", "/v1/responses", None),
        ("POST", "api.openai.com", "/v1/responses/resp_123/cancel", None),
        ("GET", "api.openai.com", "/v1/responses/resp_123", None),
        ("POST", "api.anthropic.com", "/v1/messages/count_tokens", None),
        ("POST", "api.anthropic.com", "/v1/messages/batches", None),
        ("GET", "api.openai.com", "/v1/models", None),
        ("POST", "pypi.org", "/simple/requests/", None),
    ],
)
def test_detect_endpoint(method, host, path, expected):
    assert detect_endpoint(method, host, path) == expected


def strip(obj: dict) -> tuple[dict, tuple[str, ...]]:
    result = strip_web_tools(json.dumps(obj).encode())
    assert result.body is not None, "nothing was stripped"
    return json.loads(result.body), result.removed


def fn(name: str) -> dict:
    """An OpenAI chat function tool."""
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_openai_chat_named_tools_and_tool_choice():
    body, removed = strip(
        {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [fn("WebSearch"), fn("read_file"), fn("web_fetch"), fn("Fetch-URL")],
            "tool_choice": {"type": "function", "function": {"name": "WebSearch"}},
        }
    )
    assert body["tools"] == [fn("read_file")]
    assert body["tool_choice"] == "auto"
    assert removed == ("WebSearch", "web_fetch", "Fetch-URL")
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_openai_chat_only_web_tools_removes_the_tool_settings():
    body, _ = strip(
        {
            "model": "gpt-4o",
            "messages": [],
            "tools": [fn("WebFetch")],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    )
    assert "tools" not in body and "tool_choice" not in body
    assert "parallel_tool_calls" not in body


def test_openai_chat_a_kept_tool_choice_is_kept():
    body, _ = strip(
        {
            "model": "gpt-4o",
            "tools": [fn("WebSearch"), fn("bash")],
            "tool_choice": {"type": "function", "function": {"name": "bash"}},
        }
    )
    assert body["tool_choice"] == {"type": "function", "function": {"name": "bash"}}


def test_openai_legacy_functions():
    body, removed = strip(
        {
            "model": "gpt-3.5-turbo",
            "functions": [{"name": "FetchURL"}, {"name": "calc"}],
            "function_call": {"name": "FetchURL"},
        }
    )
    assert body["functions"] == [{"name": "calc"}] and body["function_call"] == "auto"
    assert removed == ("FetchURL",)


def test_openai_responses_hosted_and_function_tools():
    bash = {"type": "function", "name": "bash", "parameters": {"type": "object"}}
    body, removed = strip(
        {
            "model": "gpt-5",
            "input": "hi",
            "tools": [
                {"type": "web_search_preview"},
                {"type": "web_search_preview_2025_03_11", "search_context_size": "low"},
                {"type": "web_search"},
                {"type": "web_search_2025_08_26"},
                {"type": "function", "name": "FetchURL", "parameters": {}},
                {"type": "custom", "name": "WebSearch"},
                bash,
            ],
            "tool_choice": {"type": "web_search_preview"},
            "include": ["web_search_call.action.sources", "reasoning.encrypted_content"],
        }
    )
    assert body["tools"] == [bash]
    assert body["tool_choice"] == "auto"
    assert body["include"] == ["reasoning.encrypted_content"]
    assert removed == (
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search",
        "web_search_2025_08_26",
        "FetchURL",
        "WebSearch",
    )


def test_openai_responses_allowed_tools_choice_is_filtered():
    body, _ = strip(
        {
            "model": "gpt-5",
            "tools": [{"type": "web_search"}, {"type": "function", "name": "bash"}],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "web_search"}, {"type": "function", "name": "bash"}],
            },
        }
    )
    assert body["tool_choice"]["tools"] == [{"type": "function", "name": "bash"}]
    assert body["tool_choice"]["mode"] == "required"


def test_anthropic_server_and_custom_tools():
    bash = {"name": "Bash", "input_schema": {"type": "object"}}
    body, removed = strip(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "web_fetch_20250910", "name": "web_fetch"},
                {"name": "WebFetch", "input_schema": {"type": "object"}},
                {"type": "custom", "name": "WebSearch", "input_schema": {"type": "object"}},
                bash,
            ],
            "tool_choice": {"type": "tool", "name": "web_search"},
        }
    )
    assert body["tools"] == [bash]
    assert body["tool_choice"] == {"type": "auto"}
    assert removed == (
        "web_search_20250305:web_search",
        "web_fetch_20250910:web_fetch",
        "WebFetch",
        "WebSearch",
    )


def test_anthropic_kept_tool_choice_and_any():
    body, _ = strip(
        {
            "model": "claude",
            "tools": [{"name": "WebSearch", "input_schema": {}}, {"name": "Bash"}],
            "tool_choice": {"type": "tool", "name": "Bash"},
        }
    )
    assert body["tool_choice"] == {"type": "tool", "name": "Bash"}
    body, _ = strip(
        {"model": "claude", "tools": [{"name": "WebSearch"}], "tool_choice": {"type": "any"}}
    )
    assert "tools" not in body and "tool_choice" not in body


def test_deepseek_uses_the_same_shapes():
    body, removed = strip(
        {"model": "deepseek-chat", "messages": [], "tools": [fn("web_search"), fn("run")]}
    )
    assert body["tools"] == [fn("run")] and removed == ("web_search",)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "gpt-4o", "tools": [{"type": "function", "function": {"name": "searcher"}}]}',
        b'{"model": "claude", "tools": [{"name": "websearcher"}, {"name": "fetch"}]}',
        b'{"model": "gpt-4o",   "messages": [], "tools": []}',
        b'{"model": "claude", "tools": [{"name": "Bash", "input_schema": {}}]}',
        b"not json at all",
        b"[1, 2, 3]",
        b"",
    ],
)
def test_untouched_bodies_keep_their_bytes(raw):
    result = strip_web_tools(raw)
    assert result.body is None and result.removed == ()


def test_a_unicode_escape_cannot_hide_a_web_tool():
    raw = rb'{"model": "claude", "tools": [{"name": "\u0057ebSearch"}, {"name": "Bash"}]}'
    result = strip_web_tools(raw)
    assert result.removed == ("WebSearch",)
    assert json.loads(result.body or b"") == {"model": "claude", "tools": [{"name": "Bash"}]}
    escaped_type = rb'{"tools": [{"type": "\u0077eb_search_20250305", "name": "x"}]}'
    assert strip_web_tools(escaped_type).removed == ("web_search_20250305:x",)


def test_json_objects_are_told_without_parsing():
    assert looks_like_json_object(b'  \n{"model": "x"}')
    assert not looks_like_json_object(b"[1]")
    assert not looks_like_json_object(b"model=x")
    assert not looks_like_json_object(b"")


# -- usage ----------------------------------------------------------------------------------
def read(api: Api, chunks: list[bytes], content_type: str, encoding: str = "") -> ResponseReader:
    reader = ResponseReader(api, content_type, encoding)
    for chunk in chunks:
        reader.feed(chunk)
    return reader


def one_byte_at_a_time(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (Api.CHAT, chat_body("gpt-4o", R)),
        (Api.RESPONSES, responses_body("gpt-4o", R)),
        (Api.MESSAGES, messages_body("claude", R)),
    ],
)
def test_usage_from_json_bodies(api, body):
    data = json.dumps(body).encode()
    reading = read(api, [data[:10], data[10:]], JSON).reading()
    assert reading.usage == R.normalized() and reading.final
    assert read(api, [gzip.compress(data)], JSON, "gzip").reading().usage == R.normalized()
    deflated = zlib.compress(data)
    reading = read(api, one_byte_at_a_time(deflated), JSON, "deflate").reading()
    assert reading.usage == R.normalized()


@pytest.mark.parametrize(
    ("api", "stream"),
    [
        (Api.CHAT, chat_stream("gpt-4o", R, include_usage=True)),
        (Api.RESPONSES, responses_stream("gpt-4o", R)),
        (Api.MESSAGES, messages_stream("claude", R)),
    ],
)
def test_usage_from_streams_byte_by_byte_equals_whole(api, stream):
    data = b"".join(stream)
    whole = read(api, [data], SSE).reading()
    assert whole.usage == R.normalized() and whole.final
    assert read(api, one_byte_at_a_time(data), SSE).reading() == whole


def test_anthropic_cache_writes_and_the_cumulative_delta():
    r = Reported(prompt=5000, cached=3000, cache_write=700, output=80)
    reading = read(Api.MESSAGES, messages_stream("claude", r), SSE).reading()
    assert reading.usage == Usage(2000, 3000, 700, 80) and reading.final


def test_a_cut_anthropic_stream_gives_a_partial_reading():
    reading = read(Api.MESSAGES, messages_stream("claude", R, cut=True), SSE).reading()
    assert reading.usage == Usage(1000, 200, 0, 1)  # message_start's counts: a lower bound
    assert not reading.final


def test_a_chat_stream_without_include_usage_has_no_usage():
    reading = read(Api.CHAT, chat_stream("gpt-4o", R, include_usage=False), SSE).reading()
    assert reading.usage is None and not reading.final


def test_deepseek_cache_hit_fields():
    body = {
        "usage": {
            "prompt_tokens": 900,
            "completion_tokens": 12,
            "prompt_cache_hit_tokens": 600,
            "prompt_cache_miss_tokens": 300,
        }
    }
    reading = read(Api.CHAT, [json.dumps(body).encode()], JSON).reading()
    assert reading.usage == Usage(300, 600, 0, 12)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -1, "completion_tokens": 2},
        {"prompt_tokens": "10", "completion_tokens": 2},
        {"prompt_tokens": True, "completion_tokens": 2},
        {"completion_tokens": 2},
        None,
    ],
)
def test_malformed_usage_is_no_usage(usage):
    reading = read(Api.CHAT, [json.dumps({"usage": usage}).encode()], JSON).reading()
    assert reading.usage is None and not reading.final


def test_unreadable_bodies_are_no_usage():
    data = json.dumps(chat_body("gpt-4o", R)).encode()
    assert read(Api.CHAT, [data], JSON, "br").reading().usage is None
    assert read(Api.CHAT, [b"garbage" + data], JSON, "gzip").reading().usage is None
    assert read(Api.CHAT, [data[:-5]], JSON).reading().usage is None


@pytest.mark.parametrize(
    ("api", "chunks", "ctype"),
    [
        (Api.CHAT, [json.dumps(chat_body("gpt-4o-2024-08-06", R)).encode()], JSON),
        (Api.CHAT, chat_stream("gpt-4o-2024-08-06", R, include_usage=True), SSE),
        (Api.RESPONSES, [json.dumps(responses_body("gpt-4o-2024-08-06", R)).encode()], JSON),
        (Api.RESPONSES, responses_stream("gpt-4o-2024-08-06", R), SSE),
        (Api.MESSAGES, [json.dumps(messages_body("gpt-4o-2024-08-06", R)).encode()], JSON),
        (Api.MESSAGES, messages_stream("gpt-4o-2024-08-06", R), SSE),
    ],
)
def test_the_response_names_the_model_it_bills(api, chunks, ctype):
    assert read(api, chunks, ctype).reading().model == "gpt-4o-2024-08-06"
