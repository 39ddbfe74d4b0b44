"""The power arithmetic against the closed-form formula (scipy's normal quantiles), a
textbook example, hand-worked tables, and a simulation of the test it describes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from maka_eval.analysis.power import (
    Components,
    achieved_power,
    assumed_components,
    detectable_difference,
    repetitions_needed,
    tasks_needed,
    z_sum,
)


def closed_form(between, within, tasks, reps, alpha=0.05, power=0.8):
    """(z(1 - alpha/2) + z(power)) sqrt((between + within / reps) / tasks), with scipy."""
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return z * math.sqrt((between + within / reps) / tasks)


@pytest.mark.parametrize(
    ("between", "within", "tasks", "reps", "alpha", "power"),
    [
        (0.1, 0.2, 100, 1, 0.05, 0.8),
        (0.1, 0.2, 100, 5, 0.05, 0.8),
        (0.05, 0.4, 500, 3, 0.01, 0.9),
        (0.25, 0.0, 40, 10, 0.05, 0.8),
        (0.0, 0.5, 30, 2, 0.1, 0.5),
        (0.02, 0.3, 2000, 15, 0.05 / 3, 0.8),
    ],
)
def test_detectable_difference_is_the_closed_form(between, within, tasks, reps, alpha, power):
    got = detectable_difference(Components(between, within), tasks, reps, alpha=alpha, power=power)
    assert got == pytest.approx(closed_form(between, within, tasks, reps, alpha, power), rel=1e-9)


def test_hand_worked_figures():
    assert z_sum() == pytest.approx(1.959964 + 0.841621, abs=1e-6)
    # between 0.1, within 0.2, 100 tasks x 1: sqrt(0.003) = 0.0547723 -> 0.153449.
    assert detectable_difference(Components(0.1, 0.2), 100, 1) == pytest.approx(0.153449, abs=1e-6)
    # The textbook case (unit variance, effect 0.5): n = (2.8016 / 0.5)^2 = 31.4 -> 32.
    assert tasks_needed(Components(1.0, 0.0), 0.5, 1) == 32
    # Repetitions shrink only the within part: between 0.05, within 0.2, 5 repetitions:
    # (0.05 + 0.04) x 7.8489 / 0.05^2 = 282.56 -> 283 tasks.
    assert tasks_needed(Components(0.05, 0.2), 0.05, 5) == 283


def test_power_at_the_detectable_difference_is_the_power_asked_for():
    c = Components(0.08, 0.3)
    for power in (0.5, 0.8, 0.9):
        d = detectable_difference(c, 120, 3, power=power)
        # The formula leaves out the far tail (a significant result of the wrong sign):
        # counted, it adds a hair (4e-5 at 50%).
        assert power <= achieved_power(c, d, 120, 3) <= power + 1e-4
    # ... and the tasks needed reach it, one task fewer does not.
    n = tasks_needed(c, 0.1, 3)
    assert detectable_difference(c, n, 3) <= 0.1 < detectable_difference(c, n - 1, 3)


def test_repetitions_needed_and_when_none_suffice():
    # 50 tasks, difference 0.1: V x tasks may be at most 50 x 0.01 / 7.8489 = 0.0637;
    # between 0.02 leaves 0.0437 for within / K = 0.18 / K: K = 4.12 -> 5.
    c = Components(0.02, 0.18)
    assert repetitions_needed(c, 0.1, 50) == 5
    assert detectable_difference(c, 50, 5) <= 0.1 < detectable_difference(c, 50, 4)
    # Between tasks alone (0.1) is above 0.0637: no number of repetitions is enough.
    assert repetitions_needed(Components(0.1, 0.18), 0.1, 50) is None
    assert repetitions_needed(Components(0.05, 0.0), 0.1, 50) == 1
    assert repetitions_needed(Components(0.07, 0.0), 0.1, 50) is None


@pytest.mark.parametrize(
    ("variance", "share", "correlation", "between", "within"),
    [
        (0.25, 0.5, 0.0, 0.25, 0.25),
        (0.2, 0.3, 0.6, 2 * 0.4 * 0.7 * 0.2, 2 * 0.3 * 0.2),
        (0.25, 0.0, 0.0, 0.5, 0.0),
        (0.1, 1.0, 0.9, 0.0, 0.2),
    ],
)
def test_assumed_components(variance, share, correlation, between, within):
    c = assumed_components(variance, share, correlation)
    assert (c.between, c.within) == (pytest.approx(between), pytest.approx(within))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: assumed_components(0.0, 0.5, 0.0), "score variance"),
        (lambda: assumed_components(0.25, 1.5, 0.0), "within-task share"),
        (lambda: assumed_components(0.25, 0.5, -2.0), "correlation"),
        (lambda: z_sum(alpha=1.0), "alpha"),
        (lambda: z_sum(power=0.0), "power"),
        (lambda: tasks_needed(Components(0.1, 0.1), -0.1, 1), "positive"),
        (lambda: Components(0.0, 0.0), "not both 0"),
        (lambda: Components(0.1, 0.1).variance(0, 1), "at least one task"),
    ],
)
def test_bad_figures_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_simulated_test_detects_the_detectable_difference_80_percent_of_the_time():
    # Per-task differences: a task effect (variance 0.04) plus repetitions' noise
    # (variance 0.25); the test: |mean of task means| / (their sd / sqrt(tasks)) > 1.96.
    c, tasks, reps = Components(0.04, 0.25), 150, 3
    d = detectable_difference(c, tasks, reps)
    rng = np.random.default_rng(0)
    runs = 4000
    effects = rng.normal(d, math.sqrt(c.between), (runs, tasks))
    noise = rng.normal(0, math.sqrt(c.within), (runs, tasks, reps)).mean(axis=2)
    task_means = effects + noise
    z = task_means.mean(axis=1) / (task_means.std(axis=1, ddof=1) / math.sqrt(tasks))
    rejected = float((np.abs(z) > stats.norm.ppf(0.975)).mean())
    assert 0.77 <= rejected <= 0.83, rejected
