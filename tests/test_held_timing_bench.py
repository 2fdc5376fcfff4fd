"""The held-timing benchmark's usage errors and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from bench import held_timing


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert held_timing.main(["--delays", "0", "--runs", "1"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--delays", "x"], ["--delays", "-5"], ["--runs", "0"], ["--log2-elements", "40"]],
)
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        held_timing.main(argv)
    assert exit_info.value.code == 2
