"""The CUDA lifecycle benchmark's table and arguments, and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from bench import cuda_lifecycles


def test_the_table_gives_median_rates_against_the_first_row() -> None:
    rows = [("context", "", [10.0, 12.0]), ("context+ops", "X=1", [9.0, 9.0, 12.0])]
    table = cuda_lifecycles.render(rows, 8, "H200")
    lines = [line for line in table.splitlines() if line.startswith("| context")]
    assert lines[0] == "| context | - | 11.00 | 90.9 | 2 | 18.2% | 1.000 |"
    assert lines[1] == "| context+ops | X=1 | 9.00 | 111.1 | 3 | 33.3% | 0.818 |"
    assert "(H200, 8, 16 in flight)" in cuda_lifecycles.render(rows, [8, 16], "H200")


def test_settings_split_on_semicolons_and_an_empty_one_is_the_default() -> None:
    assert cuda_lifecycles.parse_env(";A=0.5x;B=1,C=2") == [{}, {"A": "0.5x"}, {"B": "1", "C": "2"}]
    with pytest.raises(ValueError, match="NAME=VALUE"):
        cuda_lifecycles.parse_env("A")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cuda_lifecycles.main(["--seconds", "0.1"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "context+nothing"],
        ["--steps", ","],
        ["--in-flight", "0"],
        ["--in-flight", "8,x"],
        ["--env", "A"],
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cuda_lifecycles.main(argv)
    assert exit_info.value.code == 2
