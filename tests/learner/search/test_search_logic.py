"""The search loop against a scripted sandbox: timed choice, drops and retries, failures.

The policy answers each fragment with a stub module marked `# span A B`; the scripted
client judges a fragment's stub by a table of kernel times and an assembled run by the
spans it holds, as a GPU sandbox with timing would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

from learner.policies.base import Proposal
from learner.search.fragments import candidate_fragments
from learner.search.outcome import SEGMENTS, WHOLE
from learner.search.program import SearchError, parse
from learner.search.run import BASELINE_PROBE, search_problem
from learner.search.values import value_specs
from sandbox.result import VerifyResult

from .programs import FOUR_OPS

STUB = """\
import torch
import triton

# span {start} {stop}


def triton_fused_operator(*args):
    return [args[0]]
"""
EAGER_MS = 1.0  # every operator's eager time


class StubPolicy:
    """A stub per fragment of `source`, except for the spans in `declined`."""

    name = "stub"

    def __init__(self, source: str, declined: Sequence[tuple[int, int]] = ()) -> None:
        program = parse(source)
        fragments, _ = candidate_fragments(program, value_specs(program), 5)
        self.spans = {f.problem: f.span for f in fragments}
        self.declined = set(declined)

    def propose(self, problems: Sequence[str], samples: int = 1, seed: int = 0) -> Any:
        answers = []
        for problem in problems:
            span = self.spans[problem]
            if span in self.declined:
                answers.append([Proposal(code=None, error="declined")] * samples)
            else:
                answers.append([Proposal(code=STUB.format(start=span[0], stop=span[1]))] * samples)
        return answers


class ScriptedSandbox:
    """Judges by rule: `kernel_ms[span]` is a correct kernel's time (None: wrong output);
    a run fails when it holds a span in `fails_in_run`, or answers `run_verdict`."""

    def __init__(
        self,
        kernel_ms: dict[tuple[int, int], float | None],
        *,
        fails_in_run: Sequence[tuple[int, int]] = (),
        run_verdict: str | None = None,
        timed: bool = True,
    ) -> None:
        self.kernel_ms = kernel_ms
        self.fails_in_run = set(fails_in_run)
        self.run_verdict = run_verdict
        self.timed = timed
        self.jobs: list[dict[str, Any]] = []

    def verify_many(self, jobs: list[dict[str, Any]], concurrency: int = 32) -> list[VerifyResult]:
        self.jobs += jobs
        return [self._judge(job) for job in jobs]

    def _judge(self, job: dict[str, Any]) -> VerifyResult:
        spans = [(int(a), int(b)) for a, b in re.findall(r"# span (\d+) (\d+)", job["candidate"])]
        eager = EAGER_MS * sum(b - a for a, b in spans) if self.timed else None
        if job["candidate"] == BASELINE_PROBE:
            return VerifyResult(verdict="no_entry_point", eager_ms=EAGER_MS if self.timed else None)
        if "def frag0_" in job["candidate"]:  # an assembled run
            if self.run_verdict:
                return VerifyResult(verdict=self.run_verdict, message="scripted")
            if self.fails_in_run & set(spans):
                return VerifyResult(verdict="wrong_output", message="scripted")
            times = [self.kernel_ms[s] for s in spans]
            return self._correct(sum(t for t in times if t is not None), eager)
        (span,) = spans
        ms = self.kernel_ms.get(span)
        if ms is None:
            return VerifyResult(verdict="wrong_output", eager_ms=eager)
        return self._correct(ms, eager)

    def _correct(self, ms: float, eager: float | None) -> VerifyResult:
        if not self.timed:
            return VerifyResult(verdict="correct")
        result = VerifyResult(verdict="correct", candidate_ms=ms)
        result.apply_baselines(eager, 2 * eager if eager else None, sanity_bound=1e9)
        return result


def _spans(outcome: Any) -> list[tuple[int, int, bool]]:
    return [(p["start"], p["stop"], p["converted"]) for p in outcome.composition]


def test_timed_search_picks_the_fastest_composition_and_verifies_it_whole() -> None:
    # Steps 0-3; eager costs 1 ms each. Best: [0,2) at 0.5 + [2,4) at 0.6 = 1.1 ms.
    times: dict[tuple[int, int], float | None] = {
        (0, 1): 0.9, (1, 2): 0.9, (2, 3): 0.9, (3, 4): 0.9,
        (0, 2): 0.5, (2, 4): 0.6, (1, 3): 0.2, (0, 4): 3.0,
    }  # fmt: skip
    client = ScriptedSandbox(times)
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), client, samples=2)
    assert outcome.correct and outcome.verification == WHOLE and not outcome.hybrid
    assert _spans(outcome) == [(0, 2, True), (2, 4, True)]
    assert outcome.speedup_vs_eager == pytest.approx(4.0 / 1.1)
    assert outcome.speedup_vs_compile == pytest.approx(8.0 / 1.1)
    assert outcome.timed and outcome.converted_ops == 4
    # Identical samples are judged once; wrong ones ((0,3), (1,4)) are kept out.
    fragment_jobs = [j for j in client.jobs if "def frag0_" not in j["candidate"]]
    assert len(fragment_jobs) == 10
    chosen = {(r.start, r.stop): r.chosen for r in outcome.fragments if r.chosen}
    assert chosen == {(0, 2): "triton", (2, 4): "triton"}


def test_slow_kernels_leave_steps_in_pytorch_and_the_hybrid_is_verified_by_runs() -> None:
    times: dict[tuple[int, int], float | None] = {(1, 2): 0.25, (3, 4): 4.0, (2, 3): 2.0}
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), ScriptedSandbox(times), samples=1)
    assert outcome.correct and outcome.verification == SEGMENTS and outcome.hybrid
    assert _spans(outcome) == [(0, 1, False), (1, 2, True), (2, 4, False)]
    # Eager 4 ms against 3 ms of PyTorch plus a 0.25 ms kernel.
    assert outcome.speedup_vs_eager == pytest.approx(4.0 / 3.25)
    assert outcome.speedup_vs_compile is None
    assert "torch.matmul(tensor_0, tensor_1)" in (outcome.candidate or "")


def test_a_run_that_fails_drops_its_kernels_and_the_next_composition_is_verified() -> None:
    times: dict[tuple[int, int], float | None] = {
        (0, 1): 0.8, (1, 2): 0.8, (2, 3): 0.8, (3, 4): 0.8, (0, 4): 0.1,
    }  # fmt: skip
    client = ScriptedSandbox(times, fails_in_run=[(0, 4)])
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), client, samples=1)
    assert outcome.correct and [c.round for c in outcome.checks] == [0, 1]
    assert outcome.checks[0].verdict == "wrong_output"
    assert _spans(outcome) == [(k, k + 1, True) for k in range(4)]
    dropped = [r.span for r in outcome.fragments if r.dropped]
    assert dropped == [(0, 4)]


def test_an_unjudged_run_stops_the_search_with_an_infrastructure_verdict() -> None:
    client = ScriptedSandbox({(0, 1): 0.5}, run_verdict="sandbox_error")
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), client, samples=1)
    assert outcome.verdict == "sandbox_error" and outcome.candidate is None
    assert len(outcome.checks) == 1


def test_rounds_run_out_when_every_run_fails() -> None:
    times: dict[tuple[int, int], float | None] = {(k, k + 1): 0.5 for k in range(4)}
    times.update({(0, 2): 0.5, (2, 4): 0.5})
    client = ScriptedSandbox(times, fails_in_run=list(times))
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), client, samples=1, max_rounds=2)
    assert outcome.verdict == "wrong_output" and outcome.candidate is None
    assert [c.round for c in outcome.checks] == [0, 1]
    assert "no composition passed in 2 rounds" in outcome.message


def test_nothing_converted_reports_the_fragments_verdict() -> None:
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), ScriptedSandbox({}), samples=1)
    assert outcome.verdict == "wrong_output" and outcome.candidate is None
    assert outcome.converted_ops == 0 and not outcome.checks
    declined = StubPolicy(FOUR_OPS, declined=list(StubPolicy(FOUR_OPS).spans.values()))
    outcome = search_problem(FOUR_OPS, declined, ScriptedSandbox({}), samples=1)
    assert outcome.verdict == "no_code"
    assert all(r.error == "declined" for r in outcome.fragments)


def test_eager_times_missing_for_unanswered_steps_are_measured_by_probes() -> None:
    declined = [(1, 2)]
    client = ScriptedSandbox({(0, 1): 0.5, (2, 4): 0.5, (3, 4): 0.5})
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS, declined), client, samples=1)
    probes = [j for j in client.jobs if j["candidate"] == BASELINE_PROBE]
    assert len(probes) == 1 and probes[0]["baselines"] == ["eager"]
    row = next(r for r in outcome.fragments if r.span == (1, 2))
    assert row.eager_ms == EAGER_MS and row.chosen == "pytorch"
    assert outcome.correct and outcome.timed


def test_without_timing_the_proxy_converts_most_operators_in_fewest_fragments() -> None:
    times: dict[tuple[int, int], float | None] = {
        (0, 1): 1.0, (1, 2): 1.0, (0, 2): 1.0, (2, 3): 1.0, (1, 3): 1.0,
    }  # fmt: skip
    client = ScriptedSandbox(times, timed=False)
    outcome = search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), client, samples=1, timing=False)
    assert not outcome.timed and outcome.speedup_vs_eager is None
    assert _spans(outcome) == [(0, 1, True), (1, 3, True), (3, 4, False)]
    assert not [j for j in client.jobs if j["candidate"] == BASELINE_PROBE]


def test_bad_arguments_are_search_errors() -> None:
    with pytest.raises(SearchError, match="at least 1"):
        search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), ScriptedSandbox({}), samples=0)
    with pytest.raises(SearchError, match="max_fragment_ops"):
        search_problem(FOUR_OPS, StubPolicy(FOUR_OPS), ScriptedSandbox({}), max_fragment_ops=0)
