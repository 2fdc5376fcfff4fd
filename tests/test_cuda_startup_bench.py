"""The CUDA start-up benchmark's table, and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from bench import cuda_startup


def test_the_table_gives_processes_per_second_and_step_medians() -> None:
    marks = [
        {"cuda_init": 0.1, "first_alloc": 0.2, "bind_clock": 0.01, "total": 0.31},
        {"cuda_init": 0.3, "first_alloc": 0.6, "bind_clock": 0.03, "total": 0.93},
    ]
    rows_in = [("default", 1, [0.5], marks[:1]), ("1", 4, [1.0, 2.0], marks)]
    table = cuda_startup.render(rows_in, "H200")
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2] in "d1"]
    assert rows[0] == "| default | 1 | 1 | 2.0 | 0.500 | 0.100 | 0.200 | 0.010 | 0.310 |"
    # 4 at once in a median wall of 1.5 s; medians of the two children's steps
    assert rows[1] == "| 1 | 4 | 2 | 2.7 | 1.500 | 0.200 | 0.400 | 0.020 | 0.620 |"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cuda_startup.main(["--at-once", "1", "--rounds", "1"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--at-once", "0"],
        ["--at-once", "x"],
        ["--rounds", "0"],
        ["--connections", "many"],
        ["--connections", "0"],
    ],
)
def test_bad_counts_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cuda_startup.main(argv)
    assert exit_info.value.code == 2
