"""The sandbox throughput bench's accounting of a job's time, and its load for fidelity."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import pytest
import torch

from bench.sandbox_throughput import (
    Fidelity,
    Row,
    Server,
    account_results,
    busy_share,
    counts,
    cuda_process_rate,
    load_cases,
    other_seconds,
    parse_lifecycle_rates,
    render,
    same_speed_case,
    while_loaded,
)
from sandbox.result import VerifyResult


def test_other_time_counts_each_second_once() -> None:
    stages = {
        "queue": 5.0,  # before the job: not part of its elapsed time
        "trials": 0.3,
        "run.exchange": 0.1,  # a part of the trials' time, not more time
        "run.round_trip": 0.15,
        "timing": 0.2,
        "timed_loops": 0.1,  # a part of the timing
    }
    assert other_seconds(stages, 0.6) == pytest.approx(0.1)
    assert other_seconds(stages, 0.4) == 0.0  # never negative


def test_workers_busy_is_the_jobs_share_of_the_workers_time() -> None:
    # 8 workers for 10 s: 80 worker-seconds, of which the jobs took 72
    assert busy_share(72.0, 8, 10.0) == pytest.approx(0.9)
    assert busy_share(72.0, 8, 0.0) is None  # no run, no share


class _CountingClient:
    """Records which load items ran and how many ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.seen: list[str] = []

    def verify_many(self, items: list[dict[str, Any]], concurrency: int) -> list[None]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.seen.extend(item["problem"] for item in items)
        time.sleep(0.01)
        with self.lock:
            self.running -= 1
        return [None]


def test_the_load_runs_for_as_long_as_the_measurement() -> None:
    client = _CountingClient()
    load = [{"problem": c.problem} for c in load_cases(small=True)]
    measured: list[int] = []

    def measure() -> None:
        time.sleep(0.3)
        measured.append(len(client.seen))  # load jobs started meanwhile

    count = while_loaded(client, load, 3, measure)
    assert measured and measured[0] >= 6
    assert client.most == 3  # one job per thread at a time
    assert count == len(client.seen) >= 6
    assert set(client.seen) == {item["problem"] for item in load}  # round robin
    assert client.running == 0  # every load job ended before it returned


def test_count_lists_are_checked_before_any_server_starts() -> None:
    assert counts("8,12,16") == [8, 12, 16]
    for bad in ("0", "8,x", "", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            counts(bad)


@pytest.mark.timeout(120)  # not the 900 s a server gets to come up: it has already exited
def test_a_server_that_dies_at_start_is_an_error_at_once_with_what_it_said() -> None:
    with pytest.raises(RuntimeError, match="(?s)did not start.*invalid choice"):
        Server(1, "no-such-device", 16, weak=True)


def test_the_machines_ceiling_is_read_from_the_lifecycles_bench_and_shared_out() -> None:
    output = "context -: 12.49/s\ncontext -: 11.77/s\n# CUDA process lifecycles\n"
    assert parse_lifecycle_rates(output) == [12.49, 11.77]
    assert parse_lifecycle_rates("context+fill -: 9.00/s\n") == []  # the context row alone
    row = Row(workers=8, per_problem=8, count=200, sandbox_s=25.0)  # 8 verifications a second
    report = render([row], "cuda", True, [], [], process_rate=12.5)
    assert "12.50 bare CUDA processes" in report
    assert "| 8.000 | 64% |" in report  # 8 / 12.5
    assert "| 8.000 | n/a |" in render([row], "cuda", True, [], [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_without_a_gpu_the_ceiling_is_not_measured() -> None:
    assert cuda_process_rate(seconds=0.1) is None


def test_a_rows_accounting_completes_each_job_and_notes_what_was_not_correct() -> None:
    cases = load_cases(small=True)[:2]
    results = [
        VerifyResult("correct", elapsed_s=1.0, stage_seconds={"trials": 0.6, "run.call": 0.5}),
        VerifyResult("wrong_output", message="trial 0\ndetails", elapsed_s=2.0),
    ]
    row = Row(workers=4, per_problem=1, count=2)
    notes = account_results(row, cases, results)
    assert row.sandbox_verdicts == {"correct": 1, "wrong_output": 1}
    assert row.job_s == pytest.approx(3.0)
    assert row.stages["trials"] == [0.6]  # a job without the stage is filled in by the table
    assert row.stages["other"] == pytest.approx([0.4, 2.0])  # every job, dotted stages not
    assert notes == [f"4 workers: {cases[1].name}: wrong_output: trial 0"]


def test_the_fidelity_section_says_what_was_not_measured() -> None:
    relu = same_speed_case(small=True)
    assert Fidelity(relu, relu, relu, repeats=0).lines() == ["- not measured (--repeats 0)"]
    fidelity = Fidelity(relu, relu, relu, repeats=2, same_speed=[1.0, 1.1], loaded_jobs=7)
    lines = fidelity.lines()
    assert len(lines) == 5
    assert "no timing on this device" in lines[0] and lines[1].endswith(": n/a")
    assert "median 1.05" in lines[2]
    assert "(7 GiB elementwise jobs" in lines[4]
