"""The bundled KernelBench-style problems (synth/kernelbench/problems)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from synth.kernelbench.cli import BUNDLED
from synth.kernelbench.export import export_problem
from synth.kernelbench.load import load_problem, problem_files

FILES = problem_files([BUNDLED])

EXPECTED_FAILURES: dict[str, str] = {}
"""Bundled problem -> the reason its export is expected to fail (none today)."""

TINY = {
    "level2/residual_block.py": {"batch_size": 2, "height": 8, "width": 8},
    "level2/conv2d_groupnorm_tanh.py": {"batch_size": 2, "height": 8, "width": 8},
    "level2/linear_logsumexp_relu.py": {"batch_size": 4, "in_features": 16, "out_features": 8},
    "level1/conv2d_same_padding.py": {"batch_size": 2, "height": 8, "width": 8},
    # A Python number as one operand of a binary operator (`y * 0.5`).
    "level2/attention_scores.py": {"batch_heads": 2, "seq_len": 16, "head_dim": 8},
    "level2/conv_transpose2d_clamp_scale.py": {
        "batch_size": 2,
        "in_channels": 4,
        "out_channels": 3,
        "height": 5,
        "width": 5,
    },
    "level2/gemm_scale_residual.py": {"batch_size": 8, "in_features": 16, "out_features": 12},
}
NUMBER_OPERANDS = (
    "level2/attention_scores.py",
    "level2/conv_transpose2d_clamp_scale.py",
    "level2/gemm_scale_residual.py",
)


def _relative(path) -> str:
    return path.relative_to(BUNDLED).as_posix()


def test_at_least_thirty_problems_over_levels_one_and_two() -> None:
    levels = [load_problem(path).level for path in FILES]
    assert len(FILES) >= 30
    assert levels.count(1) >= 15 and levels.count(2) >= 10
    assert set(levels) == {1, 2}


@pytest.mark.parametrize("name", sorted(TINY))
def test_bundled_problems_at_tiny_sizes(name: str) -> None:
    result = export_problem(BUNDLED / name, overrides=TINY[name])
    assert result.ok, result.reason
    assert result.level == int(name[len("level")])


@pytest.mark.parametrize("name", NUMBER_OPERANDS)
def test_number_operands_are_registry_lines_the_teacher_translates(name: str) -> None:
    """`torch.mul(x, 0.5)` is the registry's mul, so every line maps and the teacher
    translates the program (tests/teacher/test_scalars.py runs the kernels)."""
    from synth.teacher import translate

    result = export_problem(BUNDLED / name, overrides=TINY[name])
    assert result.ok, result.reason
    assert result.unmapped_ops == () and "mul" in result.ops
    assert translate(result.source).operators == result.ops


def test_rewrite_is_deterministic() -> None:
    path = BUNDLED / "level2/conv2d_groupnorm_tanh.py"
    first = export_problem(path, overrides=TINY["level2/conv2d_groupnorm_tanh.py"])
    second = export_problem(path, overrides=TINY["level2/conv2d_groupnorm_tanh.py"])
    assert first.ok and first.source == second.source and first.ops == second.ops


def test_unknown_override_is_a_reason() -> None:
    result = export_problem(BUNDLED / "level1/relu.py", overrides={"no_such_size": 3})
    assert not result.ok and "no_such_size" in (result.reason or "")


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=_relative)
def test_every_bundled_problem_exports(path) -> None:
    result = export_problem(path)
    expected = EXPECTED_FAILURES.get(_relative(path))
    if expected is None:
        assert result.ok, result.reason
    else:
        assert not result.ok and expected in (result.reason or "")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("path", FILES, ids=_relative)
def test_rewrite_matches_model_on_gpu(path) -> None:
    """Exported on CPU, the program runs where the sandbox runs it: its own get_inputs
    drawn on the GPU, and equal there to the Model on the same tensors."""
    result = export_problem(path)
    assert result.ok, result.reason
    problem = load_problem(path)
    model = problem.make_model().cuda()
    namespace: dict[str, Any] = {}
    exec(result.source, namespace)  # noqa: S102 - the rewrite under test
    torch.manual_seed(0)
    with torch.device("cuda"):
        inputs = list(problem.get_inputs())
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    shapes = [t.shape for t in namespace["get_inputs"]()]
    feeds = [
        state[result.param_inputs[f"tensor_{i}"]].detach().reshape(shapes[i])
        for i in range(len(inputs), len(shapes))
    ]
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # both sides exact float32 convolutions
    try:
        with torch.no_grad():
            want = model(*inputs)
            got = namespace["fused_operator"](*inputs, *feeds)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    want = list(want) if isinstance(want, tuple | list) else [want]
    for g, w in zip(got, want, strict=True):
        assert g.is_cuda
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
