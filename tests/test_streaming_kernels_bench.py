"""The streaming-kernel bench: every variant it times computes the right answer."""

from __future__ import annotations

import pytest
import torch

from bench import streaming_kernels


def test_every_variant_and_the_teacher_kernel_are_correct(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert streaming_kernels.main(["--check", "--numel", "4099"]) == 0  # a ragged last block
    out = capsys.readouterr().out
    expected = len(streaming_kernels.OPS) * (len(streaming_kernels.variants()) + 1)
    assert out.count(" ok\n") == expected and "all correct" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_timing_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert streaming_kernels.main([]) == 2
    assert "timing needs a CUDA GPU" in capsys.readouterr().err
