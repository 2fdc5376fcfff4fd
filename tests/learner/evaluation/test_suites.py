"""The suites: levels, fixed-seed synthetic programs, KernelBench records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learner.evaluation import suites
from learner.evaluation.suites import SuiteError


def test_parse_levels() -> None:
    assert suites.parse_levels("1,2,5,20") == (1, 2, 5, 20)
    assert suites.parse_levels(" 2, 1,2") == (2, 1)
    for bad in ("", "0", "1,x", "-1"):
        with pytest.raises(SuiteError):
            suites.parse_levels(bad)


def test_synthetic_problems_are_fixed_by_their_settings() -> None:
    first = suites.synthetic_problems((1, 2), 2)
    again = suites.synthetic_problems((2,), 2)
    assert [p.level for p in first] == [1, 1, 2, 2]
    assert [len(p.name.split("+")) for p in first] == [1, 1, 2, 2]
    assert first[2:] == again  # a level's programs do not depend on the other levels
    with pytest.raises(SuiteError, match="unknown profile"):
        suites.synthetic_problems((1,), 1, profile="huge")
    with pytest.raises(SuiteError, match="--count"):
        suites.synthetic_problems((1,), 0)


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_kernelbench_records(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "name": "A", "level": 1, "source": "src", "ok": True, "reason": ""},
            {"id": "b", "name": "B", "level": 2, "source": "", "ok": False, "reason": "aten.x"},
        ],
    )
    a, b = suites.kernelbench_problems(path)
    assert (a.id, a.level, a.source, a.export_error) == ("a", 1, "src", None)
    assert (b.id, b.level, b.export_error) == ("b", 2, "aten.x")


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"name": "no id"}], "not a KernelBench problem record"),
        ([{"id": "a", "ok": True, "source": ""}], "has no source"),
        ([{"id": "a", "source": "s"}, {"id": "a", "source": "t"}], "appears twice"),
        ([], "no problems"),
    ],
)
def test_bad_kernelbench_files(records: list[dict], message: str, tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match=message):
        suites.kernelbench_problems(write(tmp_path / "p.jsonl", records))


def test_a_missing_problems_path(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no such"):
        suites.kernelbench_problems(tmp_path / "nothing.jsonl")


def test_a_failed_conversion_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SuiteError, match="KernelBench conversion failed|no problems"):
        suites.kernelbench_problems(empty, work_dir=tmp_path / "run")


def kernelbench_command_present() -> bool:
    from drtriton_cli import build_parser

    parser = build_parser()
    try:
        parser.parse_args(["synth", "kernelbench", "DIR", "--out", "x.jsonl"])
    except SystemExit:
        return False
    return True


def test_a_kernelbench_directory_is_converted_first(tmp_path: Path) -> None:
    if not kernelbench_command_present():
        pytest.skip("`drtriton synth kernelbench` is not in this checkout")
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "1_relu.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n\n\n"
        "def get_inputs():\n    return [torch.randn(8, 16)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    converted = suites.kernelbench_problems(problems, work_dir=tmp_path / "run")
    assert (tmp_path / "run" / "kernelbench.jsonl").is_file()
    assert len(converted) == 1
    assert converted[0].export_error is None, converted[0].export_error
    assert "def fused_operator" in converted[0].source or "relu" in converted[0].source
