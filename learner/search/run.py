"""Test-time search for one problem (DESIGN §5): fragments, kernels, the best composition.

    outcome = search_problem(problem_source, policy, client, samples=4)
    outcome.candidate, outcome.verdict, outcome.speedup_vs_eager, outcome.fragments

1. Every contiguous span of at most `max_fragment_ops` operators becomes a fragment; the
   policy answers each `samples` times; the sandbox judges each distinct answer on the
   values the program feeds that span (`fragments.py`), timed on a GPU.
2. Dynamic programming over fragment boundaries picks the fastest composition with at
   least one converted span (`compose.py`). On a GPU costs are milliseconds: a kernel's
   time, or the span's eager time left as PyTorch. Without timing they are a proxy that
   converts as many operators as possible, in as few fragments as possible.
3. Each run of adjacent converted spans is assembled into one candidate (`assemble.py`) and
   judged again: the whole program against the problem itself when every step is
   converted, otherwise each run with the PyTorch before it moved into its problem. A run
   that fails has its spans' kernels dropped and the composition is chosen again, at most
   `max_rounds` times. Only a composition that passed is reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from learner.search import compose
from learner.search.assemble import AssembleError, Part, assemble
from learner.search.fragments import DEFAULT_MAX_OPS, Fragment, candidate_fragments, make_fragment
from learner.search.outcome import SEGMENTS, WHOLE, Check, FragmentResult, SearchOutcome
from learner.search.program import SearchError, StraightLine, parse
from learner.search.values import value_specs

NO_CODE = "no_code"
INFRASTRUCTURE = frozenset({"sandbox_error", "bad_problem"})
# Sent only to learn a fragment's eager time: refused by the static checks (no entry point),
# after which a timing sandbox still measures the problem's baselines.
BASELINE_PROBE = "# baseline only: no candidate\n"


def search_problem(
    problem: str,
    policy: Any,
    client: Any,
    *,
    samples: int = 4,
    max_fragment_ops: int = DEFAULT_MAX_OPS,
    seed: int = 0,
    timing: bool = True,
    trials: int = 5,
    concurrency: int = 32,
    max_rounds: int = 3,
) -> SearchOutcome:
    """Search `problem` (functional format) with `policy` (`learner.policies.Policy`), judged
    by `client` (`sandbox.client.SandboxClient`). `SearchError` for a problem that is not
    a straight-line functional program; per-fragment failures are rows of the table."""
    if samples < 1 or max_rounds < 1:
        raise SearchError("samples and max_rounds must be at least 1")
    program = parse(problem)
    specs = value_specs(program)
    fragments, skipped = candidate_fragments(program, specs, max_fragment_ops)
    rows, codes = _propose(policy, fragments, samples, seed)
    judge = _Judge(client, trials=trials, timing=timing, concurrency=concurrency)
    judge.fragments(fragments, rows, codes)
    timed = timing and any(r.kernel_ms is not None for r in rows.values())
    if timed:
        judge.eager_baselines([f for f in fragments if f.n_ops == 1], rows)
    table = list(rows.values()) + [
        FragmentResult(s.start, s.stop, _lines(program, s.start, s.stop), error=s.reason)
        for s in skipped
    ]
    table.sort(key=lambda r: (r.stop - r.start, r.start))
    outcome = SearchOutcome(None, NO_CODE, fragments=table, total_ops=program.n_ops, timed=timed)
    _compose_and_verify(program, specs, problem, rows, judge, outcome, max_rounds)
    return outcome


def _lines(program: StraightLine, start: int, stop: int) -> list[str]:
    return [step.statement() for step in program.steps[start:stop]]


Codes = dict[tuple[int, int], list[str]]


def _propose(
    policy: Any, fragments: Sequence[Fragment], samples: int, seed: int
) -> tuple[dict[tuple[int, int], FragmentResult], Codes]:
    """A row per fragment, and each fragment's distinct answers."""
    answers = policy.propose([f.problem for f in fragments], samples=samples, seed=seed)
    if len(answers) != len(fragments):
        raise SearchError(f"the policy answered {len(answers)} of {len(fragments)} fragments")
    rows: dict[tuple[int, int], FragmentResult] = {}
    codes: Codes = {}
    for fragment, proposals in zip(fragments, answers, strict=True):
        errors = [p.error for p in proposals if p.code is None and p.error]
        rows[fragment.span] = FragmentResult(
            fragment.start,
            fragment.stop,
            list(fragment.lines),
            samples=len(proposals),
            error=errors[0] if errors else "",
        )
        codes[fragment.span] = list(dict.fromkeys(p.code for p in proposals if p.code))
    return rows, codes


class _Judge:
    """The sandbox calls of one search, with its settings."""

    def __init__(self, client: Any, *, trials: int, timing: bool, concurrency: int) -> None:
        self.client = client
        self.trials = trials
        self.timing = timing
        self.concurrency = concurrency

    def many(self, items: list[tuple[str, str]], **options: Any) -> list[Any]:
        settings = {"trials": self.trials, "timing": self.timing, **options}
        jobs = [{"problem": p, "candidate": c, **settings} for p, c in items]
        return self.client.verify_many(jobs, concurrency=self.concurrency) if jobs else []

    def fragments(
        self,
        fragments: Sequence[Fragment],
        rows: dict[tuple[int, int], FragmentResult],
        codes: Codes,
    ) -> None:
        """Judge every distinct answer of every fragment; fill in each row."""
        items = [(f.check_problem, code) for f in fragments for code in codes[f.span]]
        spans = [f.span for f in fragments for _ in codes[f.span]]
        judged: dict[tuple[int, int], list[tuple[str, Any]]] = {}
        for span, (_, code), result in zip(spans, items, self.many(items), strict=True):
            judged.setdefault(span, []).append((code, result))
        for span, row in rows.items():
            _fill(row, judged.get(span, []))

    def eager_baselines(
        self, singles: Sequence[Fragment], rows: dict[tuple[int, int], FragmentResult]
    ) -> None:
        """The eager time of each one-operator fragment that no judged answer measured."""
        missing = [f for f in singles if rows[f.span].eager_ms is None]
        items = [(f.check_problem, BASELINE_PROBE) for f in missing]
        results = self.many(items, trials=1, baselines=["eager"])
        for fragment, result in zip(missing, results, strict=True):
            rows[fragment.span].eager_ms = result.eager_ms


def _fill(row: FragmentResult, judged: list[tuple[str, Any]]) -> None:
    """A row's figures from its answers' results: the fastest correct kernel, baselines."""
    row.judged = len(judged)
    correct = [(code, r) for code, r in judged if r.verdict == "correct"]
    row.correct = len(correct)
    for _, result in judged:
        row.eager_ms = row.eager_ms if row.eager_ms is not None else result.eager_ms
        row.compile_ms = row.compile_ms if row.compile_ms is not None else result.compile_ms
    if correct:
        timed = [(r.candidate_ms, i) for i, (_, r) in enumerate(correct) if r.candidate_ms]
        best = min(timed)[1] if timed else 0
        row.code, row.kernel_ms = correct[best][0], correct[best][1].candidate_ms
        row.verdict = "correct"
    elif judged:
        row.verdict = Counter(r.verdict for _, r in judged).most_common(1)[0][0]


def _costs(
    rows: dict[tuple[int, int], FragmentResult], n_ops: int, timed: bool
) -> dict[tuple[int, int], compose.SpanCost]:
    """Each span's options. Timed: milliseconds. Otherwise a proxy: an operator left in
    PyTorch costs more than any number of fragments, so more operators are converted
    first, then in fewer (larger) fragments."""
    costs: dict[tuple[int, int], compose.SpanCost] = {}
    for span, row in rows.items():
        single = span[1] - span[0] == 1
        if timed:
            converted = row.kernel_ms if row.converted else None
            pytorch = row.eager_ms
        else:
            converted = 1.0 if row.converted else None
            pytorch = float(n_ops + 1) if single else None
        costs[span] = compose.SpanCost(converted=converted, pytorch=pytorch)
    for start in range(n_ops):  # a step no fragment can hold stays PyTorch, at no cost to compare
        costs.setdefault((start, start + 1), compose.SpanCost(pytorch=0.0))
    return costs


def _choose(
    rows: dict[tuple[int, int], FragmentResult], n_ops: int, outcome: SearchOutcome
) -> compose.Composition | None:
    if not any(row.converted for row in rows.values()):
        return None
    if outcome.timed:
        found = compose.best_composition(n_ops, _costs(rows, n_ops, timed=True))
        if found is not None:
            return found
        outcome.timed = False  # an eager time is missing: compare by the proxy instead
        outcome.message = "some eager times were not measured; compositions compared by proxy"
    return compose.best_composition(n_ops, _costs(rows, n_ops, timed=False))


def _compose_and_verify(
    program: StraightLine,
    specs: Sequence[Any],
    problem: str,
    rows: dict[tuple[int, int], FragmentResult],
    judge: _Judge,
    outcome: SearchOutcome,
    max_rounds: int,
) -> None:
    """Choose, assemble and verify until a composition passes (or the rounds run out)."""
    for round_ in range(max_rounds):
        composition = _choose(rows, program.n_ops, outcome)
        if composition is None:
            _nothing_converted(rows, outcome)
            return
        runs = compose.segments(composition)
        checks, modules = _check_runs(program, specs, problem, rows, runs, judge, round_)
        outcome.checks += checks
        failed = [c for c in checks if c.verdict != "correct"]
        if not failed:
            _report(program, rows, composition, checks, modules, outcome)
            return
        unjudged = [c for c in failed if c.verdict in INFRASTRUCTURE]
        if unjudged:  # says nothing about the kernels: stop, and say so
            outcome.verdict = unjudged[0].verdict
            outcome.message = (
                f"the sandbox could not judge the assembled candidate: {unjudged[0].message}"
            )
            return
        for check, run in zip(checks, runs, strict=True):
            if check.verdict != "correct":  # its kernels are not tried again
                for choice in run:
                    rows[(choice.start, choice.stop)].dropped = True
    last = outcome.checks[-1] if outcome.checks else None
    outcome.verdict = next(
        (c.verdict for c in reversed(outcome.checks) if c.verdict != "correct"), NO_CODE
    )
    outcome.message = f"no composition passed in {max_rounds} rounds" + (
        f"; last: {last.verdict}: {last.message}" if last else ""
    )


def _check_runs(
    program: StraightLine,
    specs: Sequence[Any],
    problem: str,
    rows: dict[tuple[int, int], FragmentResult],
    runs: Sequence[tuple[compose.Choice, ...]],
    judge: _Judge,
    round_: int,
) -> tuple[list[Check], list[str | None]]:
    """Each run assembled into one candidate and judged against its problem: the problem
    itself for the whole program, else the run's steps with the program before it moved
    into `get_inputs`."""
    checks: list[Check] = []
    modules: list[str | None] = []
    items: list[tuple[str, str]] = []
    for run in runs:
        start, stop = run[0].start, run[-1].stop
        parts = [Part(c.start, c.stop, rows[(c.start, c.stop)].code) for c in run]
        checks.append(Check(start, stop, verdict="", round=round_))
        try:
            module = assemble(program, parts, start=start, stop=stop)
        except AssembleError as err:
            checks[-1].verdict, checks[-1].message = "assemble_error", str(err)
            modules.append(None)
            continue
        whole = (start, stop) == (0, program.n_ops)
        target = problem if whole else make_fragment(program, specs, start, stop).check_problem
        items.append((target, module))
        modules.append(module)
    pending = [c for c in checks if not c.verdict]
    for check, result in zip(pending, judge.many(items), strict=True):
        check.verdict, check.message = result.verdict, result.message
        check.candidate_ms, check.eager_ms = result.candidate_ms, result.eager_ms
        check.compile_ms = result.compile_ms
        check.speedup_vs_eager = result.speedup_vs_eager
        check.speedup_vs_compile = result.speedup_vs_compile
    return checks, modules


def _report(
    program: StraightLine,
    rows: dict[tuple[int, int], FragmentResult],
    composition: compose.Composition,
    checks: Sequence[Check],
    modules: Sequence[str | None],
    outcome: SearchOutcome,
) -> None:
    """The passed composition as the outcome: its module, verdict and speedups."""
    table = {row.span: row for row in outcome.fragments}
    for choice in composition.choices:
        row = table.get((choice.start, choice.stop))
        if row is not None:
            row.chosen = "triton" if choice.converted else "pytorch"
    parts = _merge_pytorch(
        [
            Part(c.start, c.stop, rows[(c.start, c.stop)].code if c.converted else None)
            for c in composition.choices
        ]
    )
    outcome.composition = [
        {"start": p.start, "stop": p.stop, "converted": p.converted} for p in parts
    ]
    outcome.converted_ops = composition.converted_ops
    outcome.verdict = "correct"
    whole = len(checks) == 1 and (checks[0].start, checks[0].stop) == (0, program.n_ops)
    if whole:
        outcome.candidate = modules[0]
        outcome.verification = WHOLE
        outcome.speedup_vs_eager = checks[0].speedup_vs_eager
        outcome.speedup_vs_compile = checks[0].speedup_vs_compile
        return
    outcome.candidate = assemble(program, parts)
    outcome.verification = SEGMENTS
    outcome.speedup_vs_eager = _hybrid_speedup(rows, composition, checks)


def _merge_pytorch(parts: list[Part]) -> list[Part]:
    """Adjacent PyTorch spans as one (the program's lines either way)."""
    merged: list[Part] = []
    for part in parts:
        if merged and not part.converted and not merged[-1].converted:
            merged[-1] = Part(merged[-1].start, part.stop)
        else:
            merged.append(part)
    return merged


def _hybrid_speedup(
    rows: dict[tuple[int, int], FragmentResult],
    composition: compose.Composition,
    checks: Sequence[Check],
) -> float | None:
    """Eager time over the hybrid's: its runs' eager and kernel times, plus the eager time
    of its PyTorch spans on both sides (a step no fragment could hold counts as 0)."""
    eager = kernels = 0.0
    for check in checks:
        if check.eager_ms is None or not check.candidate_ms:
            return None
        eager += check.eager_ms
        kernels += check.candidate_ms
    for choice in composition.choices:
        if choice.converted:
            continue
        row = rows.get((choice.start, choice.stop))
        if row is None:
            continue  # a step no fragment can hold
        if row.eager_ms is None:
            return None
        eager += row.eager_ms
        kernels += row.eager_ms
    return eager / kernels if kernels > 0 else None


def _nothing_converted(rows: dict[tuple[int, int], FragmentResult], outcome: SearchOutcome) -> None:
    verdicts = Counter(row.verdict for row in rows.values() if row.judged)
    outcome.verdict = verdicts.most_common(1)[0][0] if verdicts else NO_CODE
    if outcome.verdict == "correct":  # every correct kernel was dropped in a failed run
        outcome.verdict = next(
            (c.verdict for c in reversed(outcome.checks) if c.verdict != "correct"), NO_CODE
        )
    outcome.message = "no fragment was converted: the program stays PyTorch"
