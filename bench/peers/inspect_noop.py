"""Inspect AI peer workload: N samples that each run ``true`` twice in a sandbox.

Run this script with the interpreter returned by
``inspect_env.ensure_inspect_python`` (it imports ``inspect_ai``).  It runs one
ordinary Inspect eval on the ``local`` sandbox with the ``mockllm/model``
model: the solver and the scorer each ``await sandbox().exec(["true"])`` and
the scorer returns a constant score, so nearly everything measured is the
framework's own per-sample work.

One line of JSON goes to stdout; everything else, Inspect's output included,
goes to stderr.

Definitions:

* ``wall_s``: wall time of the ``eval()`` call alone (it includes Inspect's
  once-per-eval start-up and the final log write); ``samples_per_s`` is
  ``samples / wall_s``.
* Per-sample wall time: from Inspect's ``SampleInit`` hook to its
  ``SampleEnd`` hook, both read with ``time.perf_counter``.  ``SampleInit``
  fires before the sample's sandbox is created and ``SampleEnd`` after the
  sample has been scored, its sandbox cleaned up and the sample written to
  the log, so this window holds nearly all of the per-sample work the
  framework does; only the hand-over of the sample slot and the building of
  the sample's state fall outside it.  The log's ``EvalSample.total_time`` is
  not used: it starts after sandbox init and stops before the sample is
  logged, which leaves out most of Inspect's per-sample cost (it is shown on
  stderr for comparison).
* Exec time: the time spent awaiting the two ``sandbox().exec`` calls,
  measured around each call in the solver and the scorer.
* Per-sample overhead: per-sample wall time minus that sample's exec time.
  With concurrency above 1 both terms also count time spent waiting for the
  event loop while other samples run, so they measure latency under load,
  not CPU cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import inspect_ai
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.hooks import Hooks, SampleEnd, SampleInit, hooks
from inspect_ai.log import EvalLog
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import sandbox

SampleKey = tuple[int | str, int]
"""A sample attempt, as (sample id, epoch)."""

# In-process side channel for timings.  The local sandbox runs the solver,
# the scorer and the hooks in this process, and keeping the figures here
# (rather than in the sample store) adds no work to the eval being measured.
_exec_s: defaultdict[SampleKey, float] = defaultdict(float)
_init_at: dict[SampleKey, float] = {}
_end_at: dict[SampleKey, float] = {}


@hooks(name="noop_timing", description="Records when each sample begins and ends.")
class SampleTiming(Hooks):
    """Timestamps Inspect's per-sample lifecycle into the side channel."""

    async def on_sample_init(self, data: SampleInit) -> None:
        """Record the start of a sample (before its sandbox is created)."""
        _init_at[(data.summary.id, data.summary.epoch)] = time.perf_counter()

    async def on_sample_end(self, data: SampleEnd) -> None:
        """Record the end of a sample (after it has been logged)."""
        _end_at[(data.sample.id, data.sample.epoch)] = time.perf_counter()


async def _exec_true(state: TaskState) -> None:
    """Run ``true`` in the sample's sandbox and add the time taken to its total."""
    started = time.perf_counter()
    result = await sandbox().exec(["true"])
    _exec_s[(state.sample_id, state.epoch)] += time.perf_counter() - started
    if not result.success:
        raise RuntimeError(f"`true` failed in the sandbox: {result.stderr}")


@solver
def exec_true_solver() -> Solver:
    """Solver that runs ``true`` once in the sandbox and changes nothing."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await _exec_true(state)
        return state

    return solve


@scorer(metrics=[mean()])
def exec_true_scorer() -> Scorer:
    """Scorer that runs ``true`` once in the sandbox and always scores 1."""

    async def score(state: TaskState, target: Target) -> Score:
        await _exec_true(state)
        return Score(value=1)

    return score


def _noop_task(samples: int) -> Task:
    """Build a task of ``samples`` identical samples on the local sandbox."""
    return Task(
        dataset=[Sample(id=i, input="noop") for i in range(1, samples + 1)],
        solver=exec_true_solver(),
        scorer=exec_true_scorer(),
        sandbox="local",
    )


def _run_eval(samples: int, concurrency: int, log_dir: str) -> tuple[EvalLog, float]:
    """Run the eval and return its log and the wall time of the ``eval()`` call."""
    # Inspect prints some notices (e.g. the enabled hooks) to stdout, which
    # is reserved for the result line.
    with contextlib.redirect_stdout(sys.stderr):
        started = time.perf_counter()
        logs = inspect_eval(
            _noop_task(samples),
            model="mockllm/model",
            display="none",
            log_dir=log_dir,
            max_samples=concurrency,
            # Inspect caps concurrent subprocesses at the CPU count by
            # default; raise the cap so that C samples really exec at once.
            # max_sandboxes stays unset: setting it adds a random sleep of up
            # to a second before each sample.
            max_subprocesses=concurrency,
        )
        wall_s = time.perf_counter() - started
    (log,) = logs
    if log.status != "success":
        raise RuntimeError(f"eval ended with status {log.status!r}: {log.error}")
    return log, wall_s


def _peak_concurrency(keys: list[SampleKey]) -> int:
    """Return the largest number of samples that were in flight at once."""
    edges = sorted([(_init_at[key], 1) for key in keys] + [(_end_at[key], -1) for key in keys])
    peak = in_flight = 0
    for _, step in edges:
        in_flight += step
        peak = max(peak, in_flight)
    return peak


def _ms(seconds: float) -> float:
    """Convert seconds to milliseconds, rounded to the microsecond."""
    return round(seconds * 1e3, 3)


def _p95(values: list[float]) -> float:
    """Return the 95th percentile of ``values`` (interpolated, inclusive)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def _summarise(log: EvalLog, samples: int, concurrency: int, wall_s: float) -> dict[str, object]:
    """Compute the result record and report diagnostics on stderr."""
    logged = log.samples or []
    keys = [(sample.id, sample.epoch) for sample in logged]
    missing = [key for key in keys if key not in _init_at or key not in _end_at]
    if len(logged) != samples or missing:
        raise RuntimeError(
            f"expected {samples} timed samples, got {len(logged)} logged "
            f"and {len(missing)} without hook timings"
        )

    exec_s = [_exec_s[key] for key in keys]
    overhead_s = [_end_at[key] - _init_at[key] - _exec_s[key] for key in keys]
    total_time_overhead_s = [
        (sample.total_time or 0.0) - _exec_s[key] for sample, key in zip(logged, keys, strict=True)
    ]
    print(
        f"inspect-noop: peak samples in flight {_peak_concurrency(keys)}; "
        "median overhead by EvalSample.total_time "
        f"{_ms(statistics.median(total_time_overhead_s))} ms",
        file=sys.stderr,
    )
    return {
        "tool": "inspect-ai",
        "version": inspect_ai.__version__,
        "samples": samples,
        "concurrency": concurrency,
        "wall_s": round(wall_s, 4),
        "samples_per_s": round(samples / wall_s, 2),
        "overhead_ms_median": _ms(statistics.median(overhead_s)),
        "overhead_ms_p95": _ms(_p95(overhead_s)),
        "exec_ms_median": _ms(statistics.median(exec_s)),
    }


def _positive_int(text: str) -> int:
    """Parse a command-line integer that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    """Parse the command line, run the workload and print the result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=_positive_int, default=500)
    parser.add_argument("--concurrency", type=_positive_int, default=1)
    parser.add_argument("--log-dir", help="where Inspect writes its log (default: a temporary dir)")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        log_dir = args.log_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="inspect-noop-")
        )
        log, wall_s = _run_eval(args.samples, args.concurrency, log_dir)
        result = _summarise(log, args.samples, args.concurrency, wall_s)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
