"""`drtriton synth kernelbench`: records for every problem, failures with reasons."""

from __future__ import annotations

import json
from pathlib import Path

from drtriton_cli import main
from learner.train.data import read_jsonl, require
from synth.teacher.build import program_id

GOOD = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))


features = 8


def get_inputs():
    return [torch.randn(4, features)]


def get_init_inputs():
    return [features]
"""

BAD = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


def get_inputs():
    return [torch.randn(4, 4)]
"""


def _problems(root: Path) -> Path:
    level = root / "problems" / "level2"
    level.mkdir(parents=True)
    (level / "good.py").write_text(GOOD)
    (level / "bad.py").write_text(BAD)
    return root / "problems"


def test_writes_one_record_per_problem(tmp_path: Path, capsys) -> None:
    out = tmp_path / "problems.jsonl"
    assert (
        main(["synth", "kernelbench", str(_problems(tmp_path)), "--out", str(out), "--quiet"]) == 0
    )
    records = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"good", "bad"}
    good, bad = records["good"], records["bad"]
    assert good["ok"] and good["reason"] is None and good["level"] == 2
    assert good["id"] == "kernelbench_l2_good"
    assert good["ops"] == ["transpose", "matmul", "add", "sigmoid"]
    assert good["param_inputs"] == {"tensor_1": "fc.weight", "tensor_2": "fc.bias"}
    assert not bad["ok"] and bad["source"] is None and "torch.export failed" in bad["reason"]
    shown = capsys.readouterr().out
    assert "bad" in shown and "torch.export failed" in shown
    # The program readers take the exported records as they take generated ones.
    (tmp_path / "ok.jsonl").write_text(json.dumps(good) + "\n")
    for number, record in read_jsonl(tmp_path / "ok.jsonl"):
        require(record, "source", str, str(number))
        require(record, "level", int, str(number))
        assert program_id(record) == "kernelbench_l2_good"


def test_bad_paths_are_usage_errors(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.jsonl"
    assert main(["synth", "kernelbench", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["synth", "kernelbench", str(tmp_path / "empty"), "--out", str(out)]) == 2
    problems = _problems(tmp_path)
    assert (
        main(["synth", "kernelbench", str(problems), "--out", str(tmp_path / "x" / "p.jsonl")]) == 2
    )
    assert not out.exists()
