"""The policy benchmark's harness on the tiny CPU model: decode timed several times, the median kept."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench import learner_bench


def test_quick_decode_reports_the_median_of_its_repeats(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    args = ["--quick", "--skip", "torch,train", "--batches", "1", "--decode-repeats", "3"]
    assert learner_bench.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    raw = report["raw"]["jax_decode/tiny/auto"]["rows"][0]
    runs = raw["decode_runs_s"]
    assert len(runs) == 3 and all(t > 0 for t in runs)
    assert raw["decode_s"] == statistics.median(runs)
    assert raw["decode_spread"] == pytest.approx((max(runs) - min(runs)) / raw["decode_s"])
    (row,) = report["decode"]
    assert row["jax_tokens_per_s"] == pytest.approx(8 / raw["decode_s"])  # 8 new tokens, batch 1
    assert "JAX spread" in out.with_suffix(".md").read_text()


def test_zero_decode_repeats_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        learner_bench.main(["--quick", "--decode-repeats", "0"])
    assert exit_info.value.code == 2
    assert "--decode-repeats must be >= 1" in capsys.readouterr().err
