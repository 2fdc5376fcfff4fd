"""Search end to end through a real local CPU sandbox, with the teacher as the policy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from learner.policies.base import Proposal
from learner.policies.teacher import TeacherPolicy
from learner.search.outcome import SEGMENTS, WHOLE
from learner.search.run import search_problem

from .programs import FOUR_OPS, load, reference


class TeacherWithout:
    """The teacher, declining every fragment that holds `operator`."""

    name = "teacher-without"

    def __init__(self, operator: str) -> None:
        self.operator = operator

    def propose(self, problems: Sequence[str], samples: int = 1, seed: int = 0) -> Any:
        answers = TeacherPolicy().propose(problems, samples, seed)
        declined = [Proposal(code=None, error="declined")] * samples
        return [
            declined if self.operator in problem.split("def fused_operator")[1] else answer
            for problem, answer in zip(problems, answers, strict=True)
        ]


def test_teacher_converts_every_fragment_and_the_whole_is_verified_correct(
    search_client: Any,
) -> None:
    outcome = search_problem(
        FOUR_OPS, TeacherPolicy(), search_client, samples=2, max_fragment_ops=2, trials=2
    )
    assert outcome.correct, outcome.message
    assert outcome.verification == WHOLE and not outcome.hybrid
    assert outcome.converted_ops == outcome.total_ops == 4
    assert len(outcome.checks) == 1 and outcome.checks[0].verdict == "correct"
    assert all(row.verdict == "correct" for row in outcome.fragments)
    assert all(row.judged == 1 for row in outcome.fragments)  # two samples, one distinct code
    # Fewest fragments: two of two operators each.
    assert [(p["start"], p["stop"]) for p in outcome.composition] == [(0, 2), (2, 4)]
    assert outcome.candidate is not None
    again = search_client.verify(FOUR_OPS, outcome.candidate, trials=2, timing=False)
    assert again.verdict == "correct"


def test_a_hybrid_keeps_unconverted_steps_in_pytorch_and_verifies_each_run(
    search_client: Any,
) -> None:
    outcome = search_problem(
        FOUR_OPS, TeacherWithout("torch.sigmoid"), search_client, samples=1, max_fragment_ops=2,
        trials=2,
    )  # fmt: skip
    assert outcome.correct, outcome.message
    assert outcome.verification == SEGMENTS and outcome.hybrid
    parts = [(p["start"], p["stop"], p["converted"]) for p in outcome.composition]
    assert parts == [(0, 2, True), (2, 3, False), (3, 4, True)]
    assert [(c.start, c.stop, c.verdict) for c in outcome.checks] == [
        (0, 2, "correct"),
        (3, 4, "correct"),
    ]
    assert outcome.candidate is not None
    assert "tensor_4 = torch.sigmoid(tensor_3)" in outcome.candidate
    inputs, expected = reference(FOUR_OPS, seed=2)
    got = load(outcome.candidate).triton_fused_operator(*inputs)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_drtriton_search_command(search_sandbox: str, tmp_path: Path) -> None:
    from drtriton_cli import main

    problem = tmp_path / "problem.py"
    problem.write_text(FOUR_OPS)
    out, module = tmp_path / "out" / "result.json", tmp_path / "candidate.py"
    args = ["search", str(problem), "--policy", "teacher", "--server", search_sandbox]
    args += ["--samples", "1", "--max-fragment-ops", "2", "--trials", "2", "--no-timing"]
    args += ["--out", str(out), "--write-candidate", str(module)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["verdict"] == "correct" and data["verification"] == WHOLE
    assert data["candidate"] == module.read_text()
    assert len(data["fragments"]) == 7 and "code" not in data["fragments"][0]


KERNELBENCH_LINEAR_RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return [8, 6]
"""


def test_drtriton_search_takes_a_kernelbench_model(search_sandbox: str, tmp_path: Path) -> None:
    """A `Model` file is rewritten through torch.export first, then searched like any
    program; one that cannot be rewritten is refused with the reason."""
    from drtriton_cli import main

    problem = tmp_path / "linear_relu.py"
    problem.write_text(KERNELBENCH_LINEAR_RELU)
    out = tmp_path / "result.json"
    args = ["search", str(problem), "--policy", "teacher", "--server", search_sandbox]
    args += ["--samples", "1", "--trials", "2", "--no-timing", "--out", str(out)]
    assert main(args) == 0
    assert json.loads(out.read_text())["verdict"] == "correct"
    problem.write_text(KERNELBENCH_LINEAR_RELU.replace("[8, 6]", "[8]"))  # Model(8) fails
    assert main(args) == 2


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no problem file"),
        ("not_straight", "expected one `name = operator"),
        ("bad_policy", "unknown policy"),
    ],
)
def test_drtriton_search_refuses_bad_input_in_one_line(
    setup: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from drtriton_cli import main

    problem = tmp_path / "problem.py"
    if setup == "not_straight":
        problem.write_text(FOUR_OPS.replace("    tensor_3 = ", "    if True:\n        tensor_3 = "))
    elif setup != "missing":
        problem.write_text(FOUR_OPS)
    policy = "oracle" if setup == "bad_policy" else "teacher"
    assert main(["search", str(problem), "--policy", policy, "--server", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.gpu
def test_timed_search_on_a_gpu_reports_measured_speedups() -> None:
    """On a GPU sandbox every fragment is timed, the DP compares milliseconds, and the
    answer carries speedups over eager, a hybrid's included."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from learner.train.verify import start_local_sandbox
    from sandbox.client import SandboxClient

    source = FOUR_OPS.replace("[8, 16]", "[4096, 1024]").replace("[16, 12]", "[1024, 2048]")
    with (
        start_local_sandbox(workers=2, device="cuda") as target,
        SandboxClient(target, timeout_s=600) as client,
    ):
        whole = search_problem(source, TeacherPolicy(), client, samples=1, max_fragment_ops=2)
        hybrid = search_problem(
            source, TeacherWithout("torch.sigmoid"), client, samples=1, max_fragment_ops=2
        )
    # Where a kernel is slower than eager its steps may stay PyTorch: then it is a hybrid.
    assert whole.correct and whole.timed, whole.message
    assert whole.speedup_vs_eager is not None
    assert (whole.speedup_vs_compile is not None) == (whole.verification == WHOLE)
    assert all(r.eager_ms is not None for r in whole.fragments if r.stop - r.start == 1)
    assert all(r.kernel_ms is not None for r in whole.fragments if r.verdict == "correct")
    assert hybrid.correct and hybrid.timed and hybrid.verification == SEGMENTS, hybrid.message
    assert hybrid.speedup_vs_eager is not None and hybrid.speedup_vs_compile is None
