"""Evaluation figures as pure functions of per-problem sample outcomes.

A problem has n sample outcomes (verdict name, speedup over eager PyTorch and over
torch.compile, either None when the sandbox did not time it). Outcomes the sandbox could
not judge (`sandbox_error`, `bad_problem`) say nothing about the kernel: they are left out
of n, and a problem with no judged outcome is left out of every rate and counted apart
(`unjudged`). A problem the suite could not even pose (a KernelBench export failure) has
one outcome, `export_failed`, and counts as wrong: failures are never dropped.

Per problem and baseline, the kernel that counts for Faster1, the mean speedups and the
speedup curve is the fastest correct sample against that baseline (with one sample per
problem, simply that sample when correct).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

CORRECT = "correct"
EXPORT_FAILED = "export_failed"
NO_CODE = "no_code"
UNSEARCHABLE = "unsearchable"  # search cannot split it (not a straight-line program)
# The same set as `sandbox.result.INFRASTRUCTURE_VERDICTS` (kept here so that this module
# imports nothing; a test checks they agree).
MASKED_VERDICTS = frozenset({"sandbox_error", "bad_problem"})
BASELINES = ("eager", "compile")
# Thresholds x of the speedup curve: 0, 0.05, ..., 4.
DEFAULT_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(81))


@dataclass(frozen=True)
class SampleOutcome:
    """One verified sample: its verdict and, when timed, its speedups."""

    verdict: str
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None

    @property
    def correct(self) -> bool:
        return self.verdict == CORRECT

    @property
    def masked(self) -> bool:
        return self.verdict in MASKED_VERDICTS

    def speedup(self, baseline: str) -> float | None:
        if baseline == "eager":
            return self.speedup_vs_eager
        if baseline == "compile":
            return self.speedup_vs_compile
        raise ValueError(f"unknown baseline {baseline!r}: one of {', '.join(BASELINES)}")


@dataclass(frozen=True)
class ProblemOutcome:
    """All samples of one problem."""

    problem_id: str
    level: int | None
    samples: tuple[SampleOutcome, ...]

    @property
    def judged(self) -> tuple[SampleOutcome, ...]:
        return tuple(s for s in self.samples if not s.masked)

    @property
    def n(self) -> int:
        return len(self.judged)

    @property
    def c(self) -> int:
        return sum(s.correct for s in self.judged)

    def best_speedup(self, baseline: str) -> float | None:
        """The largest speedup of a correct sample against `baseline` (None: none timed)."""
        speeds = [s.speedup(baseline) for s in self.judged if s.correct]
        timed = [x for x in speeds if x is not None]
        return max(timed) if timed else None

    @property
    def verdict(self) -> str:
        """`correct` when any sample is; otherwise the most frequent judged verdict (the
        earliest of a tie); with nothing judged, the most frequent masked one."""
        if not self.samples:
            raise ValueError(f"problem {self.problem_id} has no samples")
        if self.c:
            return CORRECT
        pool = self.judged or self.samples
        return Counter(s.verdict for s in pool).most_common(1)[0][0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are correct:
    1 - C(n-c, k) / C(n, k), as a product so that large n stay exact in floats."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1 (n={n}, c={c}, k={k})")
    if c == 0:
        return 0.0
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def judged_problems(problems: Iterable[ProblemOutcome]) -> list[ProblemOutcome]:
    """The problems with at least one judged sample: the denominator of every rate."""
    return [p for p in problems if p.n]


def mean_pass_at_k(problems: Sequence[ProblemOutcome], k: int) -> float | None:
    """pass@k averaged over judged problems (pass@1 = mean fraction correct); None when no
    problem was judged."""
    judged = judged_problems(problems)
    if not judged:
        return None
    return sum(pass_at_k(p.n, p.c, k) for p in judged) / len(judged)


def is_timed(problems: Sequence[ProblemOutcome], baseline: str) -> bool:
    """False when kernels are correct yet none has a speedup against `baseline`: the
    sandbox did not time them (no GPU, timing off). A whole run decides this for its
    levels too (`timed=`), so a level with nothing correct reads 0, not n/a, only when
    the run was timed."""
    correct = [s for p in problems for s in p.judged if s.correct]
    return not correct or any(s.speedup(baseline) is not None for s in correct)


def faster1(
    problems: Sequence[ProblemOutcome], baseline: str, timed: bool | None = None
) -> float | None:
    """The fraction of judged problems with a correct kernel faster than `baseline`
    (speedup > 1); None when nothing was timed or nothing judged."""
    judged = judged_problems(problems)
    if not judged or not (is_timed(judged, baseline) if timed is None else timed):
        return None
    return sum((p.best_speedup(baseline) or 0.0) > 1.0 for p in judged) / len(judged)


def speedups(problems: Sequence[ProblemOutcome], baseline: str) -> list[float]:
    """Per problem with a timed correct kernel, its best speedup against `baseline`."""
    best = (p.best_speedup(baseline) for p in problems)
    return [x for x in best if x is not None]


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    if min(values) <= 0:
        raise ValueError("a geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def verdict_fractions(problems: Sequence[ProblemOutcome]) -> dict[str, float]:
    """The fraction of all problems (unjudged included) per problem verdict, largest first."""
    if not problems:
        return {}
    counts = Counter(p.verdict for p in problems)
    return {v: n / len(problems) for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def speedup_curve(
    problems: Sequence[ProblemOutcome],
    baseline: str,
    grid: Sequence[float] = DEFAULT_GRID,
    timed: bool | None = None,
) -> list[float] | None:
    """For each x of `grid`, the fraction of judged problems whose correct kernel is faster
    than x times the baseline (the paper's figure 4); None when nothing could be timed."""
    judged = judged_problems(problems)
    if not judged or not (is_timed(judged, baseline) if timed is None else timed):
        return None
    best = [p.best_speedup(baseline) for p in judged]
    return [sum(b is not None and b > x for b in best) / len(judged) for x in grid]


def reported_ks(samples: int) -> tuple[int, ...]:
    """The k of pass@k worth a column for `samples` samples per problem."""
    return tuple(k for k in sorted({1, 2, 5, 10, samples}) if 1 <= k <= samples)


@dataclass(frozen=True)
class Summary:
    """Every figure of one set of problems (a level, or the whole suite)."""

    problems: int
    judged: int
    unjudged: int
    samples: int
    pass_at_k: dict[str, float | None]
    faster1: dict[str, float | None]
    mean_speedup: dict[str, float | None]
    geomean_speedup: dict[str, float | None]
    timed_correct: dict[str, int]
    verdicts: dict[str, float]
    sample_verdicts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(
    problems: Sequence[ProblemOutcome],
    ks: Sequence[int] = (1,),
    timed: Mapping[str, bool] | None = None,
) -> Summary:
    """The figures of `problems`; pass@k for each k in `ks` that every judged problem with
    a correct sample has enough samples for (None otherwise). `timed` per baseline: see
    `is_timed` (default: decided from `problems`)."""
    judged = judged_problems(problems)
    fewest = min((p.n for p in judged if p.c), default=None)

    def pass_k(k: int) -> float | None:
        return None if fewest is not None and fewest < k else mean_pass_at_k(problems, k)

    per_baseline = {b: speedups(judged, b) for b in BASELINES}
    sample_counts = Counter(s.verdict for p in problems for s in p.samples)
    return Summary(
        problems=len(problems),
        judged=len(judged),
        unjudged=len(problems) - len(judged),
        samples=sum(len(p.samples) for p in problems),
        pass_at_k={str(k): pass_k(k) for k in ks},
        faster1={b: faster1(problems, b, (timed or {}).get(b)) for b in BASELINES},
        mean_speedup={b: mean(v) for b, v in per_baseline.items()},
        geomean_speedup={b: geometric_mean(v) for b, v in per_baseline.items()},
        timed_correct={b: len(v) for b, v in per_baseline.items()},
        verdicts=verdict_fractions(problems),
        sample_verdicts=dict(sorted(sample_counts.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def by_level(problems: Sequence[ProblemOutcome]) -> dict[int | None, list[ProblemOutcome]]:
    """Problems grouped by level, levels in increasing order (None last)."""
    groups: dict[int | None, list[ProblemOutcome]] = {}
    for p in problems:
        groups.setdefault(p.level, []).append(p)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
