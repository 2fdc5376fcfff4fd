"""The decode kernel sweep: its grid lowers to Triton, and its trace parsing and table."""

from __future__ import annotations

import argparse

import jax
import pytest

from bench import decode_kernel_sweep as sweep


def test_every_down_setting_lowers_for_a_cuda_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep.main(["--lower-only", "--kernels", "down,attention", "--model", "0.5b"]) == 0
    count = len(sweep.GRID["down"]) + len(sweep.GRID["attention"]) + 2  # and the defaults
    assert f"{count} of {count} settings lower" in capsys.readouterr().out


def test_defaults_only_times_a_kernel_at_its_default_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--lower-only", "--kernels", "down,o_proj", "--defaults-only", "down"]
    assert sweep.main(argv) == 0
    count = 1 + len(sweep.GRID["o_proj"]) + 1
    assert f"{count} of {count} settings lower" in capsys.readouterr().out
    kernels = [s.kernel for s in sweep.settings(["down", "o_proj"], frozenset({"down"}))]
    assert kernels.count("down") == 1 and kernels.count("o_proj") == count - 1


def test_match_keeps_the_default_and_the_matching_settings() -> None:
    chosen = sweep.settings(["down", "gate_up"], match="pieces=True")
    assert [s.index for s in chosen if s.kernel == "down"][0] == 0  # the default first
    others = [s for s in chosen if s.index]
    assert others and all(s.options.get("pieces") for s in others)
    assert len(chosen) == 2 + sum(
        bool(o.get("pieces")) for k in ("down", "gate_up") for o in sweep.GRID[k]
    )


def test_bad_kernel_names_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--kernels", "down,flash"])
    assert exit_info.value.code == 2
    assert "--kernels takes some of" in capsys.readouterr().err


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU path")
def test_timing_off_the_gpu_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="timing needs a GPU"):
        sweep.main(["--kernels", "o_proj"])


def test_kernel_times_group_by_setting_with_the_combine_apart() -> None:
    events = [
        {"name": "sweep_down_3", "dur_us": 5.0},
        {"name": "sweep_down_3__1", "dur_us": 7.0},  # XLA's suffix for another instance
        {"name": "sweep_gate_up_12", "dur_us": 6.0},
        {"name": "sweep_attention_4", "dur_us": 3.0},
        {"name": "sweep_attention_4_combine__2", "dur_us": 1.5},
        {"name": "loop_convert_fusion", "dur_us": 1.0},  # not the sweep's
    ]
    assert sweep.kernel_times(events) == {
        "sweep_down_3": [5.0, 7.0],
        "sweep_gate_up_12": [6.0],
        "sweep_attention_4": [3.0],
        "sweep_attention_4_combine": [1.5],
    }


def test_the_table_compares_each_setting_with_the_default() -> None:
    args = argparse.Namespace(
        model="0.5b", rows=1, length=1536, layers=8, repeats=5, bandwidth=4000
    )
    rows = [
        {"kernel": "down", "setting": "default", "us": 6.0, "parts_us": "6.00", "bytes": 8_000_000},
        {
            "kernel": "down",
            "setting": "block_n=2",
            "us": 4.0,
            "parts_us": "4.00",
            "bytes": 8_000_000,
        },
        {"kernel": "down", "setting": "block_n=8", "us": None, "parts_us": "", "bytes": 8_000_000},
    ]
    table = sweep.render(rows, args)
    assert "| down | block_n=2 | 4.00 | 4.00 | 50% | 1.50x |" in table  # 8 MB at 4 TB/s: 2 us
    assert "| down | block_n=8 | - |" in table
    assert "- down: block_n=2 (4.00 us, 1.50x the default)" in table
