"""Reward files, Harbor-style: reward.json first, then reward.txt."""

from __future__ import annotations

import pytest

from maka_eval.relay.verifier import parse_reward_json, parse_reward_txt, read_reward


@pytest.mark.parametrize(
    ("text", "score", "error"),
    [
        (b'{"reward": 1}', 1.0, None),
        (b'{"reward": 0.25, "extra": 3}', 0.25, None),
        (b"", None, "reward.json is empty"),
        (b"[1]", None, "must be an object"),
        (b'{"reward": "1"}', None, "finite numbers"),
        (b'{"reward": true}', None, "finite numbers"),
        (b'{"reward": NaN}', None, "finite numbers"),
        (b'{"other": 0.5}', 0.5, None),  # one metric: it is the score
        (b'{"passed": 3, "total": 4}', None, "no 'reward' key and several metrics"),
        (b"{", None, "not valid JSON"),
    ],
)
def test_reward_json(text, score, error):
    result = parse_reward_json(text, "reward")
    assert result.score == score
    assert (error is None and result.error is None) or error in (result.error or "")


@pytest.mark.parametrize(
    ("text", "score"),
    [(b"1\n", 1.0), (b" 0.5 ", 0.5), (b"", None), (b"yes", None), (b"inf", None), (b"1 2", None)],
)
def test_reward_txt(text, score):
    assert parse_reward_txt(text).score == score


def test_json_is_read_before_txt(tmp_path):
    (tmp_path / "reward.txt").write_text("1")
    (tmp_path / "reward.json").write_text('{"reward": 0.0}')
    verification, name = read_reward(str(tmp_path), "reward")
    assert verification.score == 0.0 and name == "reward.json"
    (tmp_path / "reward.json").unlink()
    verification, name = read_reward(str(tmp_path), "reward")
    assert verification.score == 1.0 and name == "reward.txt"
    (tmp_path / "reward.txt").unlink()
    verification, name = read_reward(str(tmp_path), "reward")
    assert verification.score is None and "neither" in verification.error


def test_every_metric_is_recorded_and_the_score_key_picks_the_score():
    result = parse_reward_json(b'{"accuracy": 0.75, "passed": 3, "total": 4}', "accuracy")
    assert result.score == 0.75
    assert result.metrics == {"accuracy": 0.75, "passed": 3.0, "total": 4.0}
    missing = parse_reward_json(b'{"passed": 3, "total": 4}', "accuracy")
    assert missing.score is None
    assert "verifier.config.scoreKey" in (missing.error or "")


def test_metric_keys_are_recorded_escaped_and_the_score_key_read_as_written():
    data = b'{"reward": 1, "\\u001b]0;pwned\\u0007": 0.5, "\\u202eyek": 2, "a\\\\b": 3}'
    result = parse_reward_json(data, "reward")
    assert result.score == 1.0
    assert result.metrics == {
        "reward": 1.0,
        "\\x1b]0;pwned\\x07": 0.5,
        "\\u202eyek": 2.0,
        "a\\\\b": 3.0,
    }
    # a score key that needs escaping is still found
    assert parse_reward_json(b'{"r\\u001b": 0.5, "x": 1}', "r\x1b").score == 0.5


@pytest.mark.parametrize(
    "data",
    [
        b'{"\\u001b[2J": "x"}',  # a bad value: the message names its key
        b'{"\\u001b[2J": 1, "\\u009bb": 2}',  # no score key: the message lists the keys
    ],
)
def test_a_reward_error_quotes_no_key_raw(data):
    from maka_eval.printable import unsafe

    result = parse_reward_json(data, "reward\x07")
    assert result.score is None and result.error is not None
    assert "\\x1b[2J" in result.error
    assert not any(unsafe(c) for c in result.error), result.error
