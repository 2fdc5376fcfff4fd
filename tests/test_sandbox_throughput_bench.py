"""The sandbox throughput bench's accounting of a job's time."""

from __future__ import annotations

import pytest

from bench.sandbox_throughput import other_seconds


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
