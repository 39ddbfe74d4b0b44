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
