"""The provider-usage checkpoint: signed snapshots, refused tampering, one derived figure."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from maka_eval.engine.usage import Usage
from maka_eval.metering.checkpoint import (
    MAX_CHECKPOINT_BYTES,
    Checkpoint,
    CheckpointRejected,
    RejectReason,
    canonical,
    derive,
    encode,
    read_checkpoint,
    sign,
    write_checkpoint,
)
from maka_eval.metering.meter import Meter
from maka_eval.metering.pricing import ModelPrice, Prices, PricesError

TOKEN = "result-token-0123456789abcdef"
SAMPLE = Checkpoint(
    settled=True,
    requests=3,
    in_flight=0,
    admitted=2,
    usage_requests=2,
    usage_by_model={"gpt-4o": Usage(1000, 200, 0, 500), "claude-x": Usage(10, 0, 100, 5)},
)


def rejected(result: object) -> RejectReason:
    assert isinstance(result, CheckpointRejected), result
    return result.reason


def test_round_trip(tmp_path):
    folder = tmp_path / "agent"
    folder.mkdir()
    path = folder / "provider-usage.json"
    write_checkpoint(path, SAMPLE, TOKEN)
    assert read_checkpoint(path, TOKEN) == SAMPLE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in folder.iterdir()] == [path.name]  # no temporary file left
    body = json.loads(path.read_text())
    assert body["usage"] == (SAMPLE.usage).to_json()
    assert body["usage"]["totalTokens"] == 1000 + 200 + 500 + 10 + 100 + 5


def test_rewrite_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "cp.json"
    write_checkpoint(path, Checkpoint(), TOKEN)
    inode = path.stat().st_ino
    write_checkpoint(path, SAMPLE, TOKEN)
    assert path.stat().st_ino != inode  # a new file renamed into place, not rewritten
    assert read_checkpoint(path, TOKEN) == SAMPLE


def test_the_wrong_token_is_refused(tmp_path):
    path = tmp_path / "cp.json"
    write_checkpoint(path, SAMPLE, TOKEN)
    assert rejected(read_checkpoint(path, "another-token")) is RejectReason.BAD_SIGNATURE


def test_a_missing_file_is_not_suspicious(tmp_path):
    result = read_checkpoint(tmp_path / "nothing.json", TOKEN)
    assert rejected(result) is RejectReason.MISSING
    assert isinstance(result, CheckpointRejected) and not result.suspicious


def test_a_symlink_is_refused_even_to_a_valid_checkpoint(tmp_path):
    real = tmp_path / "real.json"
    write_checkpoint(real, SAMPLE, TOKEN)
    link = tmp_path / "cp.json"
    link.symlink_to(real)
    result = read_checkpoint(link, TOKEN)
    assert rejected(result) is RejectReason.NOT_REGULAR_FILE
    assert isinstance(result, CheckpointRejected) and result.suspicious


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = tmp_path / "cp.json"
    os.mkfifo(path)
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.NOT_REGULAR_FILE


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "cp.json").mkdir()
    assert rejected(read_checkpoint(tmp_path / "cp.json", TOKEN)) is RejectReason.NOT_REGULAR_FILE


def test_an_oversized_file_is_refused_even_when_signed(tmp_path):
    path = tmp_path / "cp.json"
    data = encode(SAMPLE, TOKEN)
    path.write_bytes(data.rstrip(b"\n") + b" " * (MAX_CHECKPOINT_BYTES + 1 - len(data)) + b"\n")
    assert path.stat().st_size > MAX_CHECKPOINT_BYTES
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.OVERSIZED


def test_schema_valid_json_with_a_forged_hmac_is_refused(tmp_path):
    body = Checkpoint(settled=True, requests=9, admitted=0).body()
    path = tmp_path / "cp.json"
    for forged in ("0" * 64, sign(body, "guessed-token"), sign(body, "")):
        path.write_bytes(canonical({**body, "hmac": forged}))
        assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.BAD_SIGNATURE


def test_a_changed_count_breaks_the_hmac(tmp_path):
    path = tmp_path / "cp.json"
    original = json.loads(encode(SAMPLE, TOKEN))
    original["admitted"] = 0  # hide the admitted work: an infra retry would follow
    original["usageRequests"] = 0
    path.write_text(json.dumps(original))
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.BAD_SIGNATURE


def test_a_missing_hmac_is_refused(tmp_path):
    path = tmp_path / "cp.json"
    path.write_bytes(canonical(SAMPLE.body()))
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.UNSIGNED


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "cp.json"
    data = encode(SAMPLE, TOKEN)
    for size in (0, 1, len(data) // 2, len(data) - 3):
        path.write_bytes(data[:size])
        assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.MALFORMED, size


def test_duplicate_keys_are_refused(tmp_path):
    path = tmp_path / "cp.json"
    text = encode(SAMPLE, TOKEN).decode()
    path.write_text(text.replace('{"admitted":2,', '{"admitted":0,"admitted":2,', 1))
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.MALFORMED


def test_a_signed_but_inconsistent_snapshot_is_invalid(tmp_path):
    path = tmp_path / "cp.json"
    body = Checkpoint(requests=1, admitted=1, usage_requests=1).body()
    body["usageRequests"] = 2  # more requests with usage than admitted
    path.write_bytes(canonical({**body, "hmac": sign(body, TOKEN)}))
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.INVALID
    body = Checkpoint().body()
    body["usage"] = Usage(1, 0, 0, 0).to_json()  # not the sum of usageByModel
    path.write_bytes(canonical({**body, "hmac": sign(body, TOKEN)}))
    assert rejected(read_checkpoint(path, TOKEN)) is RejectReason.INVALID


def test_an_empty_token_never_signs_nor_verifies(tmp_path):
    with pytest.raises(ValueError):
        encode(SAMPLE, "")
    path = tmp_path / "cp.json"
    body = SAMPLE.body()
    path.write_bytes(canonical({**body, "hmac": sign(body, "")}))
    assert rejected(read_checkpoint(path, "")) is RejectReason.BAD_SIGNATURE


# -- the meter: admission is on disk before the request ends -----------------------------
def test_meter_writes_every_transition(tmp_path):
    path = tmp_path / "cp.json"
    meter = Meter(path, TOKEN)
    meter.write()
    assert read_checkpoint(path, TOKEN) == Checkpoint()

    meter.started("a", "gpt-4o")
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint)
    assert (state.requests, state.in_flight, state.admitted, state.settled) == (1, 1, 0, False)

    meter.admitted("a")
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint) and state.admitted == 1 and state.in_flight == 1

    meter.finished("a", Usage(10, 0, 0, 5), final=True)
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint)
    assert (state.in_flight, state.usage_requests) == (0, 1)
    assert state.usage_by_model == {"gpt-4o": Usage(10, 0, 0, 5)}
    assert not derive(state, None).complete  # not settled: a lower bound

    meter.settle()
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint) and derive(state, None).complete

    meter.started("b", "gpt-4o")  # a later request reopens the figure
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint) and not state.settled


def test_meter_counts_each_request_once(tmp_path):
    meter = Meter(tmp_path / "cp.json", TOKEN)
    meter.started("a", "m")
    meter.started("a", "m")
    meter.admitted("a")
    meter.admitted("a")
    meter.finished("a", Usage(1, 0, 0, 1), final=True)
    meter.finished("a", Usage(1, 0, 0, 1), final=True)
    meter.admitted("a")
    s = meter.state
    assert (s.requests, s.admitted, s.in_flight, s.usage_requests) == (1, 1, 0, 1)
    assert s.usage == Usage(1, 0, 0, 1)


def test_meter_rejected_request_and_partial_usage(tmp_path):
    meter = Meter(tmp_path / "cp.json", TOKEN)
    meter.started("rejected", "m")  # e.g. a 429: never admitted, no usage
    meter.finished("rejected", None, final=False)
    meter.started("cut", "m")
    meter.admitted("cut")
    meter.finished("cut", Usage(100, 0, 0, 1), final=False)  # stream cut after message_start
    meter.settle()
    figure = derive(meter.state, None)
    assert figure.requests == 2 and figure.admitted == 1
    assert figure.missing_usage == 1 and not figure.complete
    assert figure.usage == Usage(100, 0, 0, 1)  # kept as a lower bound


def test_meter_bounds_the_number_of_models(tmp_path):
    path = tmp_path / "cp.json"
    meter = Meter(path, TOKEN)
    for i in range(50):
        meter.started(str(i), f"model-{i}" + "x" * 500)
        meter.admitted(str(i))
        meter.finished(str(i), Usage(1, 0, 0, 1), final=True)
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint)
    assert len(state.usage_by_model) == 33 and state.usage.total_tokens == 100
    assert path.stat().st_size < MAX_CHECKPOINT_BYTES


def test_meter_survives_an_unwritable_checkpoint(tmp_path):
    errors: list[str] = []
    meter = Meter(tmp_path / "gone" / "cp.json", TOKEN, on_error=errors.append)
    meter.started("a", "m")
    assert meter.state.requests == 1 and errors and "cannot write" in errors[0]


# -- derive: the one figure ----------------------------------------------------------------
PRICES = Prices(
    {
        "gpt-4o": ModelPrice(input=2.5, output=10.0, cache_read=1.25, cache_write=0.0),
        "claude-x": ModelPrice(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75),
    }
)
GPT = Usage(1000, 200, 0, 500)
GPT_COST = (1000 * 2.5 + 200 * 1.25 + 500 * 10.0) / 1e6


def cp(settled: bool, in_flight: int, admitted: int, usage_requests: int, **models: Usage):
    return Checkpoint(
        settled=settled,
        requests=admitted + in_flight + 1,
        in_flight=in_flight,
        admitted=admitted,
        usage_requests=usage_requests,
        usage_by_model=models or {"gpt-4o": GPT},
    )


# (name, checkpoint, prices, complete, missing usage, cost)
DERIVE = [
    ("settled, all usage read: complete, priced", cp(True, 0, 2, 2), PRICES, True, 0, GPT_COST),
    ("not settled: a lower bound, no cost", cp(False, 0, 2, 2), PRICES, False, 0, None),
    ("in flight: a lower bound", cp(True, 1, 2, 2), PRICES, False, 0, None),
    ("admitted without usage: missing", cp(True, 0, 3, 2), PRICES, False, 1, None),
    ("everything wrong at once", cp(False, 2, 5, 1), PRICES, False, 4, None),
    ("nothing admitted: zero cost", cp(True, 0, 0, 0, **{"gpt-4o": Usage()}), PRICES, True, 0, 0.0),
    ("no price list: no cost", cp(True, 0, 2, 2), None, True, 0, None),
    (
        "a model without a price: no cost",
        cp(True, 0, 2, 2, **{"gpt-4o": GPT, "mystery": Usage(1, 0, 0, 1)}),
        PRICES,
        True,
        0,
        None,
    ),
    (
        "two priced models add up",
        cp(True, 0, 2, 2, **{"gpt-4o": GPT, "claude-x": Usage(10, 1000, 100, 20)}),
        PRICES,
        True,
        0,
        GPT_COST + (10 * 3.0 + 1000 * 0.3 + 100 * 3.75 + 20 * 15.0) / 1e6,
    ),
]


@pytest.mark.parametrize(
    ("checkpoint", "prices", "complete", "missing", "cost"),
    [row[1:] for row in DERIVE],
    ids=[row[0] for row in DERIVE],
)
def test_derive(checkpoint, prices, complete, missing, cost):
    figure = derive(checkpoint, prices)
    assert figure.complete is complete
    assert figure.missing_usage == missing
    assert figure.usage == checkpoint.usage  # kept either way (a lower bound when partial)
    if cost is None:
        assert figure.cost_usd is None
    else:
        assert figure.cost_usd == pytest.approx(cost, abs=1e-12)
    assert ("lower bound" in figure.describe()) is (not complete)


def test_derive_names_unpriced_models():
    figure = derive(cp(True, 0, 1, 1, **{"mystery": Usage(1, 0, 0, 1)}), PRICES)
    assert figure.unpriced_models == ("mystery",) and figure.cost_usd is None


# -- prices ---------------------------------------------------------------------------------
def test_prices_round_trip_and_prefixes():
    prices = Prices.from_json(
        json.dumps(
            {
                "gpt-4o*": {
                    "inputPerMTok": 2.5,
                    "outputPerMTok": 10,
                    "cacheReadPerMTok": 1.25,
                    "cacheWritePerMTok": 0,
                },
                "gpt-4o-mini*": {
                    "inputPerMTok": 0.15,
                    "outputPerMTok": 0.6,
                    "cacheReadPerMTok": 0.075,
                    "cacheWritePerMTok": 0,
                },
                "gpt-4o-2024-05-13": {
                    "inputPerMTok": 5,
                    "outputPerMTok": 15,
                    "cacheReadPerMTok": 5,
                    "cacheWritePerMTok": 0,
                },
            }
        )
    )
    assert Prices.from_json(prices.to_json()) == prices
    assert prices.for_model("gpt-4o-2024-08-06") == prices.models["gpt-4o*"]
    assert prices.for_model("gpt-4o-mini-2024-07-18") == prices.models["gpt-4o-mini*"]
    assert prices.for_model("gpt-4o-2024-05-13") == prices.models["gpt-4o-2024-05-13"]
    assert prices.for_model("o3") is None


FULL = {"inputPerMTok": 1, "outputPerMTok": 1, "cacheReadPerMTok": 1, "cacheWritePerMTok": 1}


@pytest.mark.parametrize(
    "bad",
    [
        "[]",
        json.dumps({"m": {k: v for k, v in FULL.items() if k != "outputPerMTok"}}),
        json.dumps({"m": {k: v for k, v in FULL.items() if k != "inputPerMTok"}}),
        json.dumps({"m": {**FULL, "inputPerMTok": -1}}),
        json.dumps({"m": {**FULL, "inputPerMTok": "1"}}),
        json.dumps({"m": {**FULL, "x": 1}}),
        json.dumps({"": FULL}),
        json.dumps({"m": {**FULL, "inputPerMTok": 1}}).replace(": 1,", ": NaN,", 1),
    ],
)
def test_malformed_prices_are_refused(bad):
    with pytest.raises(PricesError):
        Prices.from_json(bad)


def test_checkpoint_file_is_what_the_reader_verifies(tmp_path: Path):
    """The canonical form is what is signed: key order in the file does not matter."""
    body = SAMPLE.body()
    mac = sign(body, TOKEN)
    shuffled = {k: body[k] for k in reversed(list(body))}
    (tmp_path / "cp.json").write_text(json.dumps({"hmac": mac, **shuffled}, indent=2))
    assert read_checkpoint(tmp_path / "cp.json", TOKEN) == SAMPLE


def test_background_writer_ends_with_the_newest_state(tmp_path):
    path = tmp_path / "cp.json"
    meter = Meter(path, TOKEN, background=True)
    for i in range(200):
        meter.started(str(i), "gpt-4o")
        meter.admitted(str(i))
        meter.finished(str(i), Usage(1, 0, 0, 1), final=True)
    assert meter.flush()
    assert read_checkpoint(path, TOKEN) == meter.state
    assert meter.state.requests == 200 and meter.state.usage_requests == 200
    meter.settle()
    meter.close()  # flushes, then stops the writer
    state = read_checkpoint(path, TOKEN)
    assert isinstance(state, Checkpoint) and state.settled
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_usage_goes_to_the_model_the_response_names(tmp_path):
    meter = Meter(tmp_path / "cp.json", TOKEN)
    meter.started("a", "gpt-4o")
    meter.admitted("a")
    meter.finished("a", Usage(1, 0, 0, 1), final=True, model="gpt-4o-2024-08-06")
    meter.started("b")
    meter.admitted("b")
    meter.finished("b", Usage(2, 0, 0, 2), final=True)  # the response named none
    assert meter.state.usage_by_model == {
        "gpt-4o-2024-08-06": Usage(1, 0, 0, 1),
        "": Usage(2, 0, 0, 2),
    }


def test_a_leftover_or_planted_temporary_file_does_not_stop_the_writer(tmp_path):
    import threading

    folder = tmp_path / "agent"
    folder.mkdir()
    path = folder / "cp.json"
    planted = folder / f".cp.json.{os.getpid()}.{threading.get_ident()}.tmp"
    os.mkfifo(planted)  # a writer must neither block on it nor write through it
    write_checkpoint(path, SAMPLE, TOKEN)
    assert read_checkpoint(path, TOKEN) == SAMPLE
    assert stat.S_ISFIFO(planted.lstat().st_mode)
    assert sorted(p.name for p in folder.iterdir()) == sorted([path.name, planted.name])


def test_cache_prices_are_optional_but_a_run_that_needs_one_has_no_cost():
    prices = Prices.from_dict({"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10}})
    assert prices.to_dict() == {"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10}}
    plain = {"gpt-4o-2024-08-06": Usage(input_tokens=1000, output_tokens=200)}
    assert prices.cost(plain) == (0.0045, ())
    cached = {"gpt-4o-2024-08-06": Usage(input_tokens=1000, cached_input_tokens=10)}
    assert prices.cost(cached) == (None, ("gpt-4o-2024-08-06",))
    assert prices.unpriced(cached) == {"gpt-4o-2024-08-06": "no cacheReadPerMTok"}
    assert prices.unpriced({"o3": Usage(output_tokens=1)}) == {"o3": "no price"}
    assert prices.unpriced({"o3": Usage()}) == {}  # no tokens: nothing to price
