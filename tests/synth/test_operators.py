"""The registry: 61 operators, each one entry that solves, prints and runs as specified."""

from __future__ import annotations

import random
import re

import pytest

from synth.dag import Dag
from synth.operators import OPERATOR_NAMES, REGISTRY
from synth.pipeline import validate_candidate
from synth.profiles import TINY
from tests.synth.helpers import solve_dag, torch_shapes

DESIGN_ORDER = [
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "lerp",
    "matmul",
    "bmm",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "var",
    "norm",
    "transpose",
    "cat",
    "stack",
    "triu",
    "tril",
    "relu",
    "leaky_relu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "silu",
    "gelu",
    "selu",
    "hardsigmoid",
    "softplus",
    "softsign",
    "elu",
    "hardtanh",
    "clamp",
    "logsigmoid",
    "cos",
    "sin",
    "exp2",
    "abs",
    "cumsum",
    "cummax",
    "cummin",
    "batch_norm",
    "layer_norm",
    "group_norm",
    "instance_norm",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
]

# The canonical call form of every operator (arguments are tensor_N names).
T = r"tensor_\d+"
N = r"\d+"
B = r"(True|False)"
CALL = {
    **{
        n: rf"torch\.{n}\({T}, {T}\)"
        for n in ("add", "sub", "mul", "div", "maximum", "minimum", "matmul", "bmm")
    },
    "lerp": rf"torch\.lerp\({T}, {T}, {T}\)",
    **{n: rf"torch\.{n}\({T}, dim={N}, keepdim={B}\)" for n in ("sum", "mean", "var", "norm")},
    **{n: rf"torch\.{n}\({T}, dim={N}, keepdim={B}\)\.values" for n in ("max", "min")},
    **{n: rf"torch\.{n}\({T}, dim={N}, keepdim={B}\)\.float\(\)" for n in ("argmax", "argmin")},
    "transpose": rf"torch\.transpose\({T}, -2, -1\)",
    "cat": rf"torch\.cat\(\[{T}, {T}\], dim={N}\)",
    "stack": rf"torch\.stack\(\[{T}, {T}\], dim={N}\)",
    **{
        n: rf"torch\.{n}\({T}\)"
        for n in ("triu", "tril", "relu", "sigmoid", "tanh", "selu", "cos", "sin", "exp2", "abs")
    },
    **{
        n: rf"F\.{n}\({T}\)"
        for n in (
            "silu",
            "gelu",
            "hardsigmoid",
            "softplus",
            "softsign",
            "logsigmoid",
            "instance_norm",
        )
    },
    "leaky_relu": rf"F\.leaky_relu\({T}, negative_slope=0\.01\)",
    "elu": rf"F\.elu\({T}, alpha=1\.0\)",
    "hardtanh": rf"F\.hardtanh\({T}, min_val=-1\.0, max_val=1\.0\)",
    "clamp": rf"torch\.clamp\({T}, min=0\.0, max=1\.0\)",
    **{n: rf"torch\.{n}\({T}, dim={N}\)" for n in ("softmax", "log_softmax", "cumsum")},
    **{n: rf"torch\.{n}\({T}, dim={N}\)\.values" for n in ("cummax", "cummin")},
    "batch_norm": rf"F\.batch_norm\(({T}), torch\.zeros\(({N}), device=\1\.device\), torch\.ones\(\2, device=\1\.device\), training=True\)",
    "layer_norm": rf"F\.layer_norm\({T}, normalized_shape=\[{N}(, {N}){{1,3}}\]\)",
    "group_norm": rf"F\.group_norm\({T}, num_groups={N}\)",
    **{
        f"avg_pool{d}d": rf"F\.avg_pool{d}d\({T}, kernel_size={N}, stride={N}, padding={N}\)"
        for d in (1, 2, 3)
    },
    **{
        f"max_pool{d}d": rf"F\.max_pool{d}d\({T}, kernel_size={N}, stride={N}, padding={N}, dilation={N}\)"
        for d in (1, 2, 3)
    },
    **{
        f"conv{d}d": rf"F\.conv{d}d\({T}, {T}, stride={N}, padding={N}, dilation={N}, groups={N}\)"
        for d in (1, 2, 3)
    },
    **{
        f"conv_transpose{d}d": rf"F\.conv_transpose{d}d\({T}, {T}, stride={N}, padding={N}, "
        rf"output_padding={N}, groups={N}, dilation={N}\)"
        for d in (1, 2, 3)
    },
}


def test_registry_holds_the_61_design_operators_in_order() -> None:
    assert len(DESIGN_ORDER) == 61
    assert list(REGISTRY) == DESIGN_ORDER == list(OPERATOR_NAMES)
    assert set(CALL) == set(REGISTRY)
    for name, op in REGISTRY.items():
        assert op.name == name
        assert op.rank_table, name
        assert all(len(ranks) == op.arity + 1 for ranks, _ in op.rank_table)


@pytest.mark.parametrize("name", DESIGN_ORDER)
def test_every_operator_alone_solves_prints_canonically_and_runs(name: str) -> None:
    """Each operator as a level-1 program: the solver's shapes are PyTorch's, the line is
    the canonical call, and the program passes validation (finite, not degenerate)."""
    for seed in range(40):
        cand = solve_dag(Dag.single(name), seed)
        if cand is None:
            continue
        rng = random.Random(seed)
        if validate_candidate(cand, TINY, rng) is None:
            break
    else:
        pytest.fail(f"no valid level-1 {name} program in 40 seeds")
    program = cand.program
    assert torch_shapes(program) == [tuple(s) for s in program.shapes]
    body = program.source.split("def fused_operator(")[1].splitlines()[1:-1]
    assert len(body) == 1
    assert re.fullmatch(rf"    tensor_{program.n_inputs} = {CALL[name]}", body[0]), body[0]
