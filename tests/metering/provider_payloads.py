"""Response bodies and event streams in the providers' own shapes (as their APIs document
them), shared by the metering unit tests and the fake provider behind the real proxy."""

from __future__ import annotations

import json
from dataclasses import dataclass

from maka_eval.engine.usage import Usage


@dataclass(frozen=True)
class Reported:
    """Token counts a fake provider reports, in the provider's own terms."""

    prompt: int = 1200
    """Input tokens including cached ones (OpenAI's prompt/input tokens)."""
    cached: int = 200
    cache_write: int = 0
    output: int = 345

    def normalized(self) -> Usage:
        return Usage(self.prompt - self.cached, self.cached, self.cache_write, self.output)


def sse(event: str | None, data: object) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}\n\n".encode()


# -- OpenAI chat completions ----------------------------------------------------------------
def chat_usage(r: Reported) -> dict[str, object]:
    return {
        "prompt_tokens": r.prompt,
        "completion_tokens": r.output,
        "total_tokens": r.prompt + r.output,
        "prompt_tokens_details": {"cached_tokens": r.cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def chat_body(model: str, r: Reported, text: str = "hello") -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": chat_usage(r),
    }


def chat_stream(model: str, r: Reported, include_usage: bool, pieces: int = 5) -> list[bytes]:
    def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **({"usage": None} if include_usage else {}),
        }

    out = [sse(None, chunk({"role": "assistant", "content": ""}))]
    out += [sse(None, chunk({"content": f"word{i} "})) for i in range(pieces)]
    out.append(sse(None, chunk({}, "stop")))
    if include_usage:
        last = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [],
            "usage": chat_usage(r),
        }
        out.append(sse(None, last))
    out.append(sse(None, "[DONE]"))
    return out


# -- OpenAI Responses -------------------------------------------------------------------
def responses_usage(r: Reported) -> dict[str, object]:
    return {
        "input_tokens": r.prompt,
        "input_tokens_details": {"cached_tokens": r.cached},
        "output_tokens": r.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": r.prompt + r.output,
    }


def responses_body(
    model: str, r: Reported, text: str = "hello", status: str = "completed"
) -> dict[str, object]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": responses_usage(r) if status == "completed" else None,
    }


def responses_stream(model: str, r: Reported, pieces: int = 5) -> list[bytes]:
    created = responses_body(model, r, status="in_progress")
    created["output"] = []
    out = [sse("response.created", {"type": "response.created", "response": created})]
    for i in range(pieces):
        out.append(
            sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": f"word{i} ",
                },
            )
        )
    done = responses_body(model, r, text=" ".join(f"word{i}" for i in range(pieces)))
    out.append(sse("response.completed", {"type": "response.completed", "response": done}))
    return out


# -- Anthropic messages -------------------------------------------------------------------
def anthropic_usage(r: Reported, output: int | None = None) -> dict[str, object]:
    return {
        "input_tokens": r.prompt - r.cached,
        "cache_read_input_tokens": r.cached,
        "cache_creation_input_tokens": r.cache_write,
        "output_tokens": r.output if output is None else output,
    }


def messages_body(model: str, r: Reported, text: str = "hello") -> dict[str, object]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": anthropic_usage(r),
    }


def messages_stream(model: str, r: Reported, pieces: int = 5, cut: bool = False) -> list[bytes]:
    start = messages_body(model, r, text="")
    start["content"] = []
    start["stop_reason"] = None
    start["usage"] = anthropic_usage(r, output=1)
    out = [sse("message_start", {"type": "message_start", "message": start})]
    out.append(
        sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
    )
    out.append(sse("ping", {"type": "ping"}))
    for i in range(pieces):
        out.append(
            sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": f"word{i} "},
                },
            )
        )
    if cut:
        return out
    out.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": r.output},
            },
        )
    )
    out.append(sse("message_stop", {"type": "message_stop"}))
    return out
