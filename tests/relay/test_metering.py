"""The signed provider-usage checkpoint: the attempt's usage and cost where the egress
proxy metered the cell, whatever the result frame says, and the fallback that keeps a
killed wrapper's work on record."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.engine.usage import Usage
from maka_eval.metering.checkpoint import Checkpoint, canonical, write_checkpoint
from maka_eval.relay.frame import frame_bytes
from maka_eval.relay.plan import AttemptPlan, MeteringPlan, PlanError
from tests.relay.conftest import sh

V1 = ResultContract.PROTOCOL_V1
TOKEN = "relay-result-token-5f2a"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "MAKA_EVAL_RESULT_TOKEN": TOKEN}
PRICES = {
    "gpt-4o": {
        "inputPerMTok": 2.5,
        "outputPerMTok": 10.0,
        "cacheReadPerMTok": 1.25,
        "cacheWritePerMTok": 0.0,
    }
}
USAGE = Usage(1000, 200, 0, 500)
COST = (1000 * 2.5 + 200 * 1.25 + 500 * 10.0) / 1e6
SETTLED = Checkpoint(
    settled=True, requests=2, admitted=2, usage_requests=2, usage_by_model={"gpt-4o": USAGE}
)


@pytest.fixture
def metered_plan(plan_for, tmp_path):
    def build(script: str, checkpoint: Checkpoint | None = SETTLED) -> AttemptPlan:
        path = tmp_path / "proxy" / "provider-usage.json"
        path.parent.mkdir(exist_ok=True)
        if checkpoint is not None:
            write_checkpoint(path, checkpoint, TOKEN)
        plan = plan_for(sh(script), contract=V1)
        return replace(plan, metering=MeteringPlan(str(path), prices=PRICES))

    return build


def checkpoint_path(plan: AttemptPlan):
    from pathlib import Path

    assert plan.metering is not None
    return Path(plan.metering.checkpoint)


def test_killed_wrapper_after_admitted_work_is_a_subject_failure(metered_plan, run):
    """The wrapper was killed, not asked to stop: no frame, but the model work was
    done and billed. Scored as a failed subject, not retried as infrastructure."""
    plan = metered_plan("touch done.txt; kill -9 $$")
    outcome = run(plan, host_env=ENV)
    c = outcome.classification
    assert c.status is AttemptStatus.SUBJECT_FAILED
    assert c.source is StatusSource.ADMITTED_WORK
    assert c.score == 1.0  # the verifier's reward is kept
    assert c.usage == USAGE and c.cost_usd == pytest.approx(COST)
    assert outcome.kernel.usage == USAGE and outcome.kernel.cost_usd == pytest.approx(COST)
    assert any("recovered from the provider-usage checkpoint" in n for n in outcome.kernel.notes)


def test_a_partial_checkpoint_is_a_lower_bound_without_cost(metered_plan, run):
    unsettled = replace(SETTLED, settled=False, in_flight=1, requests=3)
    outcome = run(metered_plan("touch done.txt", unsettled), host_env=ENV)
    c = outcome.classification
    assert c.status is AttemptStatus.SUBJECT_FAILED and c.source is StatusSource.ADMITTED_WORK
    assert c.usage == USAGE and c.cost_usd is None
    assert "lower bound" in (c.reason or "")
    assert any("lower bound" in n for n in outcome.kernel.notes)


def test_no_admitted_work_leaves_a_missing_frame_an_infra_failure(metered_plan, run):
    refused = Checkpoint(settled=True, requests=4)  # e.g. every request got a 429
    outcome = run(metered_plan("touch done.txt", refused), host_env=ENV)
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert outcome.classification.source is StatusSource.INFRASTRUCTURE


def test_a_forged_checkpoint_is_ignored_and_noted(metered_plan, run):
    """The subject replaces the checkpoint with schema-valid JSON and a made-up HMAC."""
    forged = Checkpoint(settled=True).body()
    forged_text = json.dumps({**forged, "hmac": "0" * 64})
    plan = metered_plan("touch done.txt")
    path = checkpoint_path(plan)
    script = f"cat > {path}.new <<'EOF'\n{forged_text}\nEOF\nmv {path}.new {path}; touch done.txt"
    plan = replace(plan, subject=replace(plan.subject, argv=tuple(sh(script))))
    outcome = run(plan, host_env=ENV)
    # The real checkpoint (2 admitted) is gone, the forged one is refused: nothing on record.
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert outcome.classification.usage is None
    assert any("suspected tampering" in n and "bad_signature" in n for n in outcome.kernel.notes)


def test_a_symlinked_checkpoint_is_ignored_and_noted(metered_plan, run, tmp_path):
    plan = metered_plan("touch done.txt", None)
    real = tmp_path / "elsewhere.json"
    write_checkpoint(real, SETTLED, TOKEN)
    checkpoint_path(plan).symlink_to(real)
    outcome = run(plan, host_env=ENV)
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert any("not_regular_file" in n for n in outcome.kernel.notes)


def test_an_unsigned_checkpoint_is_ignored(metered_plan, run):
    plan = metered_plan("touch done.txt", None)
    checkpoint_path(plan).write_bytes(canonical(SETTLED.body()))
    outcome = run(plan, host_env=ENV)
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert any("unsigned" in n for n in outcome.kernel.notes)


def test_a_missing_checkpoint_means_nothing_on_record(metered_plan, run):
    outcome = run(metered_plan("touch done.txt", None), host_env=ENV)
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert any("checkpoint is missing" in n for n in outcome.kernel.notes)


def test_without_the_token_the_checkpoint_is_not_read(metered_plan, run):
    env = {k: v for k, v in ENV.items() if k != "MAKA_EVAL_RESULT_TOKEN"}
    outcome = run(metered_plan("touch done.txt"), host_env=env)
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert any("MAKA_EVAL_RESULT_TOKEN" in n for n in outcome.kernel.notes)


def _framed(usage: Usage | None, cost: float | None) -> str:
    frame = frame_bytes("completed", usage, cost).decode()
    return f"touch done.txt; printf '%s' '{frame}' > \"$MAKA_EVAL_RESULT_FILE\""


@pytest.mark.parametrize(
    ("usage", "cost", "said"),
    [
        (Usage(), 0.0, "0 tokens and $0.0000"),  # under-reported
        (Usage(1, 0, 0, 1), 0.5, "2 tokens and $0.5000"),
        (Usage(10**9, 0, 0, 10**9), 99_999.0, "2,000,000,000 tokens and $99,999.0000"),
    ],
)
def test_a_valid_frames_figures_never_outrank_the_meter(metered_plan, run, usage, cost, said):
    """The frame's status decides; the usage, cost (and so the budget) are the signed
    checkpoint's, and the frame's own figures are kept beside them as evidence."""
    settled: list[int] = []
    outcome = run(
        metered_plan(_framed(usage, cost)), host_env=ENV, settle_metering=lambda: settled.append(1)
    )
    c = outcome.classification
    assert c.status is AttemptStatus.COMPLETED and c.source is StatusSource.FRAME
    assert c.usage == USAGE and c.cost_usd == pytest.approx(COST)
    assert outcome.kernel.usage == USAGE and outcome.kernel.cost_usd == pytest.approx(COST)
    assert settled == [1]  # the proxy was settled for a valid frame too
    assert outcome.kernel.notes[0] == (
        f"suspected misreport: the subject reported {said}, the proxy metered 1,700 tokens "
        f"and ${COST:.4f}"
    )
    assert any("usage metered by the egress proxy" in n for n in outcome.kernel.notes)


def test_a_frame_that_agrees_with_the_meter_adds_no_note(metered_plan, run):
    outcome = run(metered_plan(_framed(USAGE, round(COST, 4))), host_env=ENV)
    assert outcome.classification.usage == USAGE
    assert not any("reported" in n for n in outcome.kernel.notes)


def test_a_frame_reporting_more_than_a_lower_bound_is_kept_beside_it(metered_plan, run):
    unsettled = replace(SETTLED, settled=False, in_flight=1, requests=3)
    outcome = run(metered_plan(_framed(Usage(2000, 200, 0, 600), 0.01), unsettled), host_env=ENV)
    c = outcome.classification
    assert c.usage == USAGE and c.cost_usd is None  # the lower bound, no cost
    assert outcome.kernel.notes[0] == (
        "the subject reported 2,800 tokens and $0.0100; the record holds the proxy's "
        "figure, at least 1,700 tokens and no cost"
    )


def test_a_frame_counts_where_the_proxy_saw_no_model_request(metered_plan, run):
    """A provider the proxy does not read: nothing metered, the frame's figure stands."""
    outcome = run(
        metered_plan(_framed(Usage(7, 0, 0, 3), 0.5), Checkpoint(settled=True)), host_env=ENV
    )
    assert outcome.classification.usage == Usage(7, 0, 0, 3)
    assert outcome.classification.cost_usd == 0.5


def test_a_tampered_checkpoint_leaves_the_frames_figure_and_says_so(metered_plan, run):
    plan = metered_plan(_framed(Usage(1, 0, 0, 1), 0.5))
    checkpoint_path(plan).write_text("tampered")
    outcome = run(plan, host_env=ENV)
    assert outcome.classification.status is AttemptStatus.COMPLETED
    assert outcome.classification.usage == Usage(1, 0, 0, 1)
    assert any("suspected tampering" in n for n in outcome.kernel.notes)


def test_the_proxy_is_settled_before_the_checkpoint_is_read(metered_plan, run):
    plan = metered_plan("touch done.txt", replace(SETTLED, settled=False))
    path = checkpoint_path(plan)

    def settle() -> None:  # what ProxyHandle.settle does, in-process
        write_checkpoint(path, SETTLED, TOKEN)

    outcome = run(plan, host_env=ENV, settle_metering=settle)
    assert outcome.classification.cost_usd == pytest.approx(COST)


def test_the_metering_plan_round_trips_and_bad_prices_are_refused(metered_plan):
    plan = metered_plan("true")
    assert AttemptPlan.from_json(plan.to_json()) == plan
    data = json.loads(plan.to_json())
    assert "MAKA_EVAL_RESULT_TOKEN" not in json.dumps(data).replace(
        '"token_env": "MAKA_EVAL_RESULT_TOKEN"', ""
    )
    assert TOKEN not in plan.to_json()
    data["metering"]["prices"] = {"gpt-4o": {"inputPerMTok": -1}}
    with pytest.raises(PlanError):
        AttemptPlan.from_json(json.dumps(data))
