"""Reading the verifier's reward the way Harbor does: reward.json first, then reward.txt.

reward.json must be a flat object of finite numbers; every value is recorded as a metric
and the configured key (`verifier.config.scoreKey`, default `reward`) becomes the score.
When that key is missing, a file holding exactly one metric scores with it (nothing else
can be meant); several metrics and none of them the key is "no reward". reward.txt must
hold one number. Anything else is "no reward": an infrastructure failure, never a zero.

The keys are recorded escaped (maka_eval.printable.escaped: a key with an ESC or a bidi
override becomes `\\x1b` or `\\u202e`): a subject may write reward.json through a
verifier it fooled, and a key must not carry a raw control character into a record or
onto a terminal. The score key is looked up as written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from maka_eval import strict_json
from maka_eval.engine.classify import Verification
from maka_eval.printable import escaped, visible
from maka_eval.relay.frame import read_bounded

MAX_REWARD_BYTES = 64 * 1024


def _finite_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def parse_reward_json(data: bytes, score_key: str) -> Verification:
    """Score from reward.json content."""
    if not data.strip():
        return Verification(None, "reward.json is empty")
    try:
        rewards = strict_json.loads(data.decode("utf-8"))
    except strict_json.NonFiniteNumberError:
        return Verification(None, "reward.json values must be finite numbers (not NaN/Infinity)")
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Verification(None, "reward.json is not valid JSON")
    if not isinstance(rewards, dict):
        return Verification(None, "reward.json must be an object of numbers")
    bad = sorted(escaped(k) for k, v in rewards.items() if not _finite_number(v))
    if bad:
        return Verification(
            None, f"reward.json values must be finite numbers (not: {', '.join(bad)[:80]})"
        )
    metrics = {escaped(k): float(v) for k, v in rewards.items()}
    if score_key in rewards:
        return Verification(float(rewards[score_key]), metrics=metrics)
    if len(rewards) == 1:
        return Verification(next(iter(metrics.values())), metrics=metrics)
    keys = ", ".join(sorted(metrics))[:80] or "none"
    return Verification(
        None,
        f"reward.json has no '{visible(score_key)}' key and several metrics (keys: {keys}); set "
        "verifier.config.scoreKey to the one that is the score",
    )


def parse_reward_txt(data: bytes) -> Verification:
    """Score from reward.txt content."""
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        return Verification(None, "reward.txt is empty")
    try:
        value = float(text)
    except ValueError:
        return Verification(None, f"reward.txt does not hold one number: {text[:40]!r}")
    if not math.isfinite(value):
        return Verification(None, "reward.txt does not hold a finite number")
    return Verification(value)


def read_reward(
    logs_dir: str, score_key: str, scrub: Callable[[bytes], bytes] = bytes
) -> tuple[Verification, str | None]:
    """The verification and the name of the reward file it came from (if any).

    `scrub` is applied to the file's bytes before they are parsed, so that no message
    about them can carry a credential value.
    """
    try:
        dir_fd = os.open(logs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Verification(None, "the verifier logs directory is missing"), None
    try:
        for name in ("reward.json", "reward.txt"):
            try:
                data = read_bounded(dir_fd, name, MAX_REWARD_BYTES)
            except OSError as exc:
                return Verification(None, f"{name} cannot be read: {exc}"), None
            if data is None:
                continue
            if len(data) > MAX_REWARD_BYTES:
                return Verification(None, f"{name} is larger than {MAX_REWARD_BYTES} bytes"), name
            if name == "reward.json":
                return parse_reward_json(scrub(data), score_key), name
            return parse_reward_txt(scrub(data)), name
        return Verification(None, "neither reward.json nor reward.txt was written"), None
    finally:
        os.close(dir_fd)
