"""Baselines are measured once per problem: the first timed job measures, the rest wait.

Only a GPU sandbox times anything, so the runner's bookkeeping is driven here
directly, with the grading task stood in by a finished future.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sandbox.config import SandboxConfig
from sandbox.result import VerifyResult
from sandbox.runner import JobRunner


def _job() -> dict[str, Any]:
    return {"timing": True, "known_baselines": {}, "baselines": ("eager", "torch_compile")}


def _finished(result: dict[str, Any]) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result({"result": result})
    return future


def test_one_job_measures_and_the_others_get_its_baselines(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, ...]:
        runner = JobRunner(SandboxConfig(device="cpu", job_root=str(tmp_path)))
        runner.device = "cuda"  # the bookkeeping only; no worker is started
        owner, waiter = _job(), _job()
        assert runner._claim_baselines("p", owner) is None
        pending = runner._claim_baselines("p", waiter)
        assert pending is not None and waiter["defer_baselines"]
        assert "defer_baselines" not in owner
        runner._release_baselines("p", _finished({"eager_ms": 2.0, "compile_ms": 1.0}))
        result = VerifyResult(verdict="correct", candidate_ms=0.5)
        await runner._add_deferred_baselines(result, waiter, pending, 0.0, None)
        # Later jobs of the problem are given the times up front.
        later = _job()
        later["known_baselines"] = dict(runner._baselines["p"])
        return result, runner._claim_baselines("p", later), later

    result, claim, later = asyncio.run(scenario())
    assert (result.eager_ms, result.compile_ms) == (2.0, 1.0)
    assert (result.speedup_vs_eager, result.speedup_vs_compile) == (4.0, 2.0)
    assert claim is None and "defer_baselines" not in later


def test_an_owner_that_measured_nothing_lets_the_next_job_measure(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, ...]:
        runner = JobRunner(SandboxConfig(device="cpu", job_root=str(tmp_path)))
        runner.device = "cuda"
        runner._claim_baselines("p", _job())
        waiter = _job()
        pending = runner._claim_baselines("p", waiter)
        assert pending is not None
        runner._release_baselines("p", _finished({"eager_ms": None, "compile_ms": None}))
        result = VerifyResult(verdict="correct", candidate_ms=0.5)
        await runner._add_deferred_baselines(result, waiter, pending, 0.0, None)
        return result, runner._claim_baselines("p", _job())

    result, claim = asyncio.run(scenario())
    assert result.speedup_vs_eager is None
    assert claim is None  # no one is measuring: the next job becomes the owner


def test_an_untimed_job_neither_measures_nor_waits(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, ...]:
        runner = JobRunner(SandboxConfig(device="cpu", job_root=str(tmp_path)))
        runner.device = "cuda"
        runner._claim_baselines("p", _job())
        untimed = _job() | {"timing": False}
        return runner._claim_baselines("p", untimed), untimed, "p" in runner._measuring

    claim, untimed, still_measuring = asyncio.run(scenario())
    assert claim is None and "defer_baselines" not in untimed
    assert still_measuring  # the owner's measurement is left alone
