"""The evaluation figures against values worked out by hand."""

from __future__ import annotations

import math
import random

import pytest

from learner.evaluation import metrics
from learner.evaluation.metrics import ProblemOutcome, SampleOutcome


def sample(verdict: str, eager: float | None = None, compile_: float | None = None):
    return SampleOutcome(verdict, eager, compile_)


def problem(pid: str, level: int | None, *samples: SampleOutcome) -> ProblemOutcome:
    return ProblemOutcome(pid, level, tuple(samples))


# P1: 2 of 3 correct, best 2.0x eager / 1.5x compile; P2: nothing correct; P3: 1 of 2 judged
# correct (one sandbox_error masked); P4: nothing judged; P5: an export failure.
PROBLEMS = [
    problem(
        "p1",
        1,
        sample("correct", 2.0, 1.5),
        sample("correct", 0.8, 0.5),
        sample("wrong_output"),
    ),
    problem("p2", 1, sample("wrong_output"), sample("compile_error"), sample("wrong_output")),
    problem("p3", 2, sample("correct", 0.9, 0.6), sample("sandbox_error"), sample("no_code")),
    problem("p4", 2, sample("sandbox_error"), sample("sandbox_error")),
    problem("p5", 2, sample("export_failed")),
]


def test_pass_at_k_by_hand() -> None:
    assert metrics.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert metrics.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert metrics.pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert metrics.pass_at_k(5, 2, 4) == 1.0  # any 4 of 5 hold a correct one
    assert metrics.pass_at_k(5, 0, 3) == 0.0
    assert metrics.pass_at_k(1, 0, 4) == 0.0  # nothing correct: 0 whatever k


def test_pass_at_k_is_the_combinatorial_ratio() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 60)
        c, k = rng.randint(0, n), rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert metrics.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (2, 3, 1), (3, -1, 1), (3, 1, 0)])
def test_pass_at_k_refuses_what_it_cannot_estimate(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        metrics.pass_at_k(n, c, k)


def test_per_problem_facts() -> None:
    p1, p2, p3, p4, p5 = PROBLEMS
    assert (p1.n, p1.c, p3.n, p3.c, p4.n, p5.n) == (3, 2, 2, 1, 0, 1)
    assert p1.best_speedup("eager") == 2.0 and p1.best_speedup("compile") == 1.5
    assert p2.best_speedup("eager") is None
    assert [p.verdict for p in PROBLEMS] == [
        "correct",
        "wrong_output",
        "correct",
        "sandbox_error",
        "export_failed",
    ]
    tie = problem("t", 1, sample("runtime_error"), sample("timeout"))
    assert tie.verdict == "runtime_error"  # a tie goes to the first seen
    with pytest.raises(ValueError):
        sample("correct").speedup("inductor")


def test_rates_by_hand() -> None:
    assert metrics.mean_pass_at_k(PROBLEMS, 1) == pytest.approx((2 / 3 + 0 + 1 / 2 + 0) / 4)
    assert metrics.mean_pass_at_k(PROBLEMS, 2) == pytest.approx(2 / 4)
    assert metrics.faster1(PROBLEMS, "eager") == pytest.approx(1 / 4)
    assert metrics.faster1(PROBLEMS, "compile") == pytest.approx(1 / 4)
    assert metrics.mean_pass_at_k([PROBLEMS[3]], 1) is None  # nothing judged


def test_speedups_by_hand() -> None:
    eager = metrics.speedups(PROBLEMS, "eager")
    assert sorted(eager) == [0.9, 2.0]
    assert metrics.mean(eager) == pytest.approx(1.45)
    assert metrics.geometric_mean(eager) == pytest.approx(math.sqrt(1.8))
    compile_ = metrics.speedups(PROBLEMS, "compile")
    assert metrics.mean(compile_) == pytest.approx(1.05)
    assert metrics.geometric_mean(compile_) == pytest.approx(math.sqrt(0.9))
    assert metrics.mean([]) is None and metrics.geometric_mean([]) is None


def test_verdict_fractions_count_every_problem() -> None:
    assert metrics.verdict_fractions(PROBLEMS) == {
        "correct": 0.4,
        "export_failed": 0.2,
        "sandbox_error": 0.2,
        "wrong_output": 0.2,
    }


def test_speedup_curve_by_hand() -> None:
    grid = [0.0, 0.5, 0.9, 1.0, 1.95, 2.0, 3.0]
    assert metrics.speedup_curve(PROBLEMS, "eager", grid) == [0.5, 0.5, 0.25, 0.25, 0.25, 0, 0]
    assert metrics.speedup_curve(PROBLEMS, "compile", grid) == [0.5, 0.5, 0.25, 0.25, 0, 0, 0]
    default = metrics.speedup_curve(PROBLEMS, "eager")
    assert len(default) == len(metrics.DEFAULT_GRID) and default[0] == 0.5


def test_untimed_runs_have_no_speed_figures() -> None:
    untimed = [problem("a", 1, sample("correct")), problem("b", 1, sample("wrong_output"))]
    assert metrics.faster1(untimed, "eager") is None
    assert metrics.speedup_curve(untimed, "eager") is None
    assert metrics.mean_pass_at_k(untimed, 1) == 0.5
    # Nothing correct at all: nobody is faster, that is a measured 0.
    assert metrics.faster1([problem("b", 1, sample("wrong_output"))], "eager") == 0.0


def test_summary_by_hand() -> None:
    summary = metrics.summarize(PROBLEMS, ks=(1, 2, 3))
    assert (summary.problems, summary.judged, summary.unjudged, summary.samples) == (5, 4, 1, 12)
    assert summary.pass_at_k["1"] == pytest.approx(7 / 24)
    assert summary.pass_at_k["2"] == pytest.approx(0.5)
    assert summary.pass_at_k["3"] is None  # p3 has only 2 judged samples
    assert summary.faster1 == {"eager": 0.25, "compile": 0.25}
    assert summary.timed_correct == {"eager": 2, "compile": 2}
    assert summary.sample_verdicts["sandbox_error"] == 3
    levels = metrics.by_level(PROBLEMS)
    assert list(levels) == [1, 2] and [p.problem_id for p in levels[2]] == ["p3", "p4", "p5"]


def test_reported_ks() -> None:
    assert metrics.reported_ks(1) == (1,)
    assert metrics.reported_ks(4) == (1, 2, 4)
    assert metrics.reported_ks(10) == (1, 2, 5, 10)


def test_masked_verdicts_are_the_sandboxs() -> None:
    from sandbox.result import INFRASTRUCTURE_VERDICTS

    assert metrics.MASKED_VERDICTS == INFRASTRUCTURE_VERDICTS
