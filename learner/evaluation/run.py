"""`drtriton eval`: a policy's kernels for a suite's problems, verified, one line per sample.

Problems go to the policy in fixed batches (`settings.batch` problems, batch b with seed
`settings.seed + b`), k samples each, and every sample is verified by the sandbox fleet;
with `search`, each problem goes through test-time search instead (one whole candidate,
verified by search itself; problem i of the suite with seed `settings.seed + i`). A
resumed run asks the policy again for the whole batch a missing problem belongs to, so a
deterministic policy gives the answers an uninterrupted run would have, and only the
missing problems are verified and written.

    summary = run_eval(EvalSettings(levels=(1, 2), samples=4), Path("runs/eval/x"))
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from learner.evaluation import store
from learner.evaluation.metrics import (
    EXPORT_FAILED,
    UNSEARCHABLE,
    ProblemOutcome,
    mean_pass_at_k,
)
from learner.evaluation.store import EvalSettings
from learner.evaluation.suites import SUITES, EvalProblem, SuiteError


class EvalError(RuntimeError):
    """The evaluation cannot go on (a policy that answers the wrong number of problems)."""


def make_problems(settings: EvalSettings, run_dir: Path) -> list[EvalProblem]:
    """The suite's problems (a KernelBench directory is converted into `run_dir`)."""
    from learner.evaluation import suites

    if settings.suite == "synthetic":
        workers = max(1, min(8, os.cpu_count() or 1, settings.count))
        return suites.synthetic_problems(
            settings.levels, settings.count, settings.profile, settings.seed, workers=workers
        )
    if settings.suite == "kernelbench":
        if not settings.problems:
            raise SuiteError("--suite kernelbench needs --problems FILE.jsonl or DIR")
        return suites.kernelbench_problems(Path(settings.problems), work_dir=run_dir)
    raise SuiteError(f"unknown suite {settings.suite!r}: one of {', '.join(SUITES)}")


def load_policy(spec: str, **options: Any) -> Any:
    """The policy a spec names (`teacher`, `checkpoint:PATH`, `hosted:URL#MODEL`), made with
    `options` (None values are left to the policy's defaults)."""
    from learner.policies.registry import load_policy as load

    return load(spec, **options)


def check_settings(settings: EvalSettings) -> None:
    if settings.suite not in SUITES:
        raise SuiteError(f"unknown suite {settings.suite!r}: one of {', '.join(SUITES)}")
    for name in ("samples", "trials", "batch", "max_fragment_ops"):
        if getattr(settings, name) < 1:
            raise SuiteError(f"--{name.replace('_', '-')} must be at least 1")


def run_eval(
    settings: EvalSettings,
    run_dir: Path,
    *,
    resume: bool = False,
    policy: Any = None,
    client: Any = None,
    sandbox: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) an evaluation into `run_dir`; returns the summary that `report.py`
    wrote. `policy` defaults to `load_policy(settings.policy)`, `client` to a client of
    `sandbox` (a `learner.train.config.SandboxConfig`; default a local server)."""
    from learner.evaluation.report import write_report

    settings = settings.normalized()
    check_settings(settings)
    run_dir = Path(run_dir)
    if policy is None:
        policy = load_policy(settings.policy, **settings.policy_options())
    # Nothing is written before the problems, the policy and the fleet are ready, so a
    # failed start leaves no run behind to be resumed.
    if store.check_run(run_dir, settings, resume=resume):
        problems, fresh = store.read_problems(run_dir), False
    else:
        problems, fresh = make_problems(settings, run_dir), True
    done = {} if fresh else store.reopen_samples(run_dir)
    with contextlib.ExitStack() as stack:
        if client is None and any(p.id not in done for p in problems):
            client = stack.enter_context(_client(sandbox))
        if fresh:
            store.start_run(run_dir, settings, problems)
        handle = stack.enter_context(open(run_dir / store.SAMPLES_FILE, "a"))
        bar = stack.enter_context(_Progress(len(problems), enabled=progress))
        outcomes = [store.outcome_of(p, done[p.id]) for p in problems if p.id in done]
        bar.update(outcomes)
        for index, batch in enumerate(_batches(problems, settings.batch)):
            pending = [p for p in batch if p.id not in done]
            if not pending:
                continue
            for problem, lines in _judge_batch(settings, index, batch, pending, policy, client):
                store.append_lines(handle, lines)
                outcomes.append(store.outcome_of(problem, lines))
                bar.update(outcomes)
    return write_report(run_dir)


def _client(sandbox: Any) -> Any:
    from learner.train.config import SandboxConfig
    from learner.train.verify import sandbox_client

    return sandbox_client(sandbox if sandbox is not None else SandboxConfig())


def _batches(problems: Sequence[EvalProblem], size: int) -> Iterator[list[EvalProblem]]:
    for start in range(0, len(problems), size):
        yield list(problems[start : start + size])


def _judge_batch(
    settings: EvalSettings,
    index: int,
    batch: list[EvalProblem],
    pending: list[EvalProblem],
    policy: Any,
    client: Any,
) -> Iterator[tuple[EvalProblem, list[dict[str, Any]]]]:
    """(problem, its sample lines) for each pending problem of batch `index`, in order."""
    posed = [p for p in pending if p.export_error is None]
    if settings.search:  # one search per problem, seeded by its place in the suite
        first = index * settings.batch
        for problem in pending:
            if problem.export_error is not None:
                yield problem, [_export_failure(problem)]
            else:
                seed = settings.seed + first + batch.index(problem)
                yield problem, [_search_line(settings, problem, policy, client, seed)]
        return
    judged = dict(
        _sample_and_verify(settings, batch, posed, policy, client, settings.seed + index)
        if posed
        else {}
    )
    for problem in pending:
        yield problem, judged.get(problem.id) or [_export_failure(problem)]


def _export_failure(problem: EvalProblem) -> dict[str, Any]:
    return store.sample_line(problem, 0, 1, EXPORT_FAILED, message=problem.export_error or "")


def _sample_and_verify(
    settings: EvalSettings,
    batch: list[EvalProblem],
    posed: list[EvalProblem],
    policy: Any,
    client: Any,
    seed: int,
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(problem id, its sample lines) for the posed problems: the policy is asked for the
    whole batch (its answers depend on the batch), only `posed` are verified."""
    from learner.train.verify import verify_codes

    asked = [p for p in batch if p.export_error is None]
    answers = policy.propose([p.source for p in asked], settings.samples, seed)
    if len(answers) != len(asked) or any(len(a) != settings.samples for a in answers):
        raise EvalError(
            f"policy {getattr(policy, 'name', policy)!r} answered {len(answers)} problems "
            f"(sample counts {[len(a) for a in answers]}) for {len(asked)} problems x "
            f"{settings.samples} samples"
        )
    by_id = dict(zip((p.id for p in asked), answers, strict=True))
    proposals = [(p, i, prop) for p in posed for i, prop in enumerate(by_id[p.id])]
    results = verify_codes(
        client,
        [p.source for p, _, _ in proposals],
        [prop.code for _, _, prop in proposals],
        trials=settings.trials,
        timing=settings.timing,
        seed=settings.seed,
    )
    lines: dict[str, list[dict[str, Any]]] = {p.id: [] for p in posed}
    for (problem, i, prop), result in zip(proposals, results, strict=True):
        message = result.message if prop.code is not None else (prop.error or result.message)
        lines[problem.id].append(
            store.sample_line(
                problem,
                i,
                settings.samples,
                result.verdict,
                speedup_vs_eager=result.speedup_vs_eager,
                speedup_vs_compile=result.speedup_vs_compile,
                message=message,
                code=prop.code,
            )
        )
    yield from lines.items()


def _search_line(
    settings: EvalSettings, problem: EvalProblem, policy: Any, client: Any, seed: int
) -> dict[str, Any]:
    from learner.search.program import SearchError
    from learner.search.run import search_problem

    try:
        outcome = search_problem(
            problem.source,
            policy,
            client,
            samples=settings.samples,
            max_fragment_ops=settings.max_fragment_ops,
            seed=seed,
            timing=settings.timing,
        )
    except SearchError as err:  # not a straight-line program: a failure of this problem
        return store.sample_line(problem, 0, 1, UNSEARCHABLE, message=str(err))
    return store.sample_line(
        problem,
        0,
        1,
        outcome.verdict,
        speedup_vs_eager=outcome.speedup_vs_eager,
        speedup_vs_compile=outcome.speedup_vs_compile,
        message=str(getattr(outcome, "message", "") or ""),
        code=outcome.candidate,
    )


class _Progress:
    """A rich progress bar over problems showing pass@1 so far (nothing when disabled)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._total = total
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self._enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("eval"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[score]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("eval", total=self._total, score="")
        return self

    def update(self, outcomes: Sequence[ProblemOutcome]) -> None:
        if self._progress is None:
            return
        rate = mean_pass_at_k(outcomes, 1)
        score = f"pass@1 {rate:.3f}" if rate is not None else ""
        self._progress.update(self._task, completed=len(outcomes), score=score)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


def pending_count(run_dir: Path) -> int:
    """Problems of a run not yet done (for messages and tests)."""
    done = store.complete_samples(store.read_sample_lines(run_dir / store.SAMPLES_FILE))
    return sum(p.id not in done for p in store.read_problems(run_dir))
