#!/usr/bin/env python3
"""A scripted stand-in for an LLM agent, speaking the protocol-v1 result contract.

It reads the instruction, "plans" with fixed rules (no model, no network), acts on the
workspace, and writes a result frame to $MAKA_EVAL_RESULT_FILE with the token usage
and cost a model call of that size would have had. It is deliberately imperfect: it
sorts names case-sensitively and gives up on tasks it has no rule for, so its scores
differ from the oracle's.
"""

import json
import os
import sys
from pathlib import Path

PRICE_PER_MILLION = {"input": 0.30, "output": 1.20}  # a small model's list price, USD


def tokens(text: str) -> int:
    """Roughly four characters per token, like most BPE vocabularies."""
    return max(1, len(text) // 4)


def act(instruction: str) -> tuple[str, str]:
    """Do what the rules say; return (status, what was done)."""
    if "greeting.txt" in instruction:
        Path("greeting.txt").write_text("Hello, world!\n")
        return "completed", "rewrote greeting.txt"
    if "numbers.txt" in instruction:
        total = sum(int(line) for line in Path("numbers.txt").read_text().split())
        Path("answer.txt").write_text(f"{total}\n")
        return "completed", f"summed to {total}"
    if "names.txt" in instruction:
        names = Path("names.txt").read_text().split()
        Path("sorted.txt").write_text("\n".join(sorted(names)) + "\n")  # case-sensitive: wrong
        return "completed", "sorted the names"
    return "subject_failed", "no rule for this task"


def main() -> int:
    instruction = Path(os.environ["MAKA_EVAL_INSTRUCTION_FILE"]).read_text()
    status, note = act(instruction)
    print(note)
    prompt_tokens = 350 + tokens(instruction)  # system prompt + instruction
    output_tokens = 40 + tokens(note)
    cost = (
        prompt_tokens * PRICE_PER_MILLION["input"] + output_tokens * PRICE_PER_MILLION["output"]
    ) / 1_000_000
    frame = {
        "protocol": "maka.eval.result.v1",
        "status": status,
        "usage": {
            "inputTokens": prompt_tokens,
            "cachedInputTokens": 0,
            "cacheWriteTokens": 0,
            "outputTokens": output_tokens,
        },
        "costUsd": round(cost, 8),
    }
    Path(os.environ["MAKA_EVAL_RESULT_FILE"]).write_text(json.dumps(frame))
    # The exit code projects the same status as the frame: zero only when completed.
    return 0 if status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
