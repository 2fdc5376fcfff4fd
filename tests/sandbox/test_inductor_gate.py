"""Inductor's GPU benchmarks run under the gate's hold; its compile does not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox import inductor_gate


class FakeBenchmarker:
    """Stands in for Inductor's benchmarker: one benchmark calls the other, as Inductor's does."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def benchmark_gpu(self, fn: Any) -> float:
        self.events.append("bench")
        fn()
        return 1.0

    def benchmark_gpu_with_cuda_graph(self, fn: Any) -> float:
        return self.benchmark_gpu(fn)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeBenchmarker, list[str]]:
    log: list[str] = []
    fake = FakeBenchmarker(log)
    monkeypatch.setattr(inductor_gate, "_benchmarker", lambda: fake)
    return fake, log


def _hold(log: list[str]) -> Any:
    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        log.append("hold")
        yield
        log.append("release")

    return hold


def test_benchmarks_run_under_one_hold_each(events: tuple[FakeBenchmarker, list[str]]) -> None:
    fake, log = events
    with inductor_gate.gated_autotuning(_hold(log)) as gated:
        assert gated
        log.append("compile")
        fake.benchmark_gpu(lambda: log.append("kernel"))
        fake.benchmark_gpu_with_cuda_graph(lambda: log.append("graph"))
    assert log == [
        "compile",
        "hold", "bench", "kernel", "release",
        # The nested call takes no second hold (a second shared lock could deadlock
        # against a waiting writer).
        "hold", "bench", "graph", "release",
    ]  # fmt: skip


def test_methods_are_restored_even_after_an_error(
    events: tuple[FakeBenchmarker, list[str]],
) -> None:
    fake, log = events
    with pytest.raises(RuntimeError), inductor_gate.gated_autotuning(_hold(log)):
        raise RuntimeError("compile failed")
    fake.benchmark_gpu(lambda: None)
    assert "benchmark_gpu" not in vars(fake)
    assert log == ["bench"]  # no hold outside the block


def test_without_a_benchmarker_the_caller_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inductor_gate, "_benchmarker", lambda: None)
    with inductor_gate.gated_autotuning(contextlib.nullcontext) as gated:
        assert not gated


def test_this_torch_has_the_benchmarker_it_patches() -> None:
    benchmarker = inductor_gate._benchmarker()
    assert benchmarker is not None
    assert callable(getattr(benchmarker, "benchmark_gpu", None))
    with inductor_gate.gated_autotuning(contextlib.nullcontext) as gated:
        assert gated
        assert "benchmark_gpu" in vars(benchmarker)
    assert "benchmark_gpu" not in vars(benchmarker)
