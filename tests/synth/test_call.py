"""The registry's call signatures and its shape rules on known sizes (`output_shape`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from synth.generate import generate_programs
from synth.operators import REGISTRY
from synth.operators.call import REQUIRED
from synth.operators.infer import ShapeError, output_shape


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_operator_states_its_call_and_prints_it(name: str) -> None:
    op = REGISTRY[name]
    call = op.call
    assert call is not None and call.names, name
    assert len(set(call.names)) == len(call.names)
    assert len(set(call.param_names)) == len(call.param_names)
    if call.tensor_list:
        assert len(call.tensors) == 1
    else:
        assert len(call.tensors) == op.arity
    assert all(n in call.tensors for n in call.numbers)
    tensors = [f"tensor_{i}" for i in range(op.arity)]
    shape = [[2, 4, 6, 6, 6]] * op.arity
    params = {"dim": 1, "keepdim": True, "k": 2, "num_groups": 2, "kernel_size": 3, "stride": 1}
    params |= {"padding": 0, "dilation": 1, "groups": 1, "output_padding": 0}
    printed = op.render(tensors, params, shape)
    assert printed.startswith(f"{call.name}("), printed
    assert printed.endswith(call.suffix or ")"), printed
    keywords = {part.split("=")[0].strip() for part in printed.split(", ") if "=" in part}
    assert keywords - {"device"} <= set(call.param_names), printed


def test_required_parameters_and_pytorch_defaults() -> None:
    pool = dict(REGISTRY["max_pool2d"].call.params)
    assert pool["kernel_size"] is REQUIRED and pool["stride"] is None and pool["dilation"] == 1
    assert "divisor_override" not in REGISTRY["avg_pool1d"].call.param_names  # PyTorch has none
    assert "divisor_override" in REGISTRY["avg_pool2d"].call.param_names
    assert REGISTRY["conv_transpose2d"].call.param_names == (
        "bias",
        "stride",
        "padding",
        "output_padding",
        "groups",
        "dilation",
    )
    assert REGISTRY["relu"].call.names == ("torch.relu", "F.relu")
    assert REGISTRY["argmax"].call.suffix == ".float()" and REGISTRY["cummax"].call.suffix
    assert REGISTRY["lerp"].call.numbers == ("weight",)


def _call_params(params: dict) -> dict:
    """A generated node's parameters as a program states them: no private choices, and
    no `kernel_size` for a convolution (its weight holds it)."""
    return {k: v for k, v in params.items() if not k.startswith("_")}


def test_output_shapes_of_generated_programs_are_the_solvers() -> None:
    """The rule that constrained the solver, run on the solved sizes, gives the same
    shapes, with the generator's private choices or with the call's parameters only."""
    checked = set()
    for level, count in ((1, 61), (3, 30)):
        for record in generate_programs(level, count, seed=3, profile="tiny"):
            shapes = record.graph["shapes"]
            for node in record.graph["nodes"]:
                ins = [shapes[i] for i in node["inputs"]]
                want = tuple(shapes[node["output"]])
                assert output_shape(node["op"], ins, node["params"]) == want
                call_params = _call_params(node["params"])
                if node["op"].startswith("conv"):
                    call_params.pop("kernel_size")
                assert output_shape(node["op"], ins, call_params) == want
                checked.add(node["op"])
    assert len(checked) >= 55


CASES = [
    # (operator, input shapes, params, the same in PyTorch)
    ("add", [[2, 1, 5], [3, 1]], {}, lambda a, b: torch.add(a, b)),
    ("matmul", [[4, 1, 3, 5], [2, 5, 6]], {}, torch.matmul),
    ("sum", [[3, 1, 4]], {"dim": 1, "keepdim": False}, lambda x: x.sum(1)),
    ("max_pool1d", [[5, 17]], {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2},
     lambda x: F.max_pool1d(x, 3, 2, 1, 2)),
    ("avg_pool2d", [[3, 9, 8]], {"kernel_size": 2, "stride": 2, "padding": 0},
     lambda x: F.avg_pool2d(x, 2, 2, 0)),
    ("conv2d", [[6, 9, 10], [4, 3, 2, 5]],
     {"stride": 2, "padding": 1, "dilation": 1, "groups": 2},
     lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=2)),
    ("conv_transpose1d", [[2, 4, 7], [4, 3, 5]],
     {"stride": 3, "padding": 1, "dilation": 2, "groups": 2, "output_padding": 1},
     lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=1, output_padding=1, groups=2,
                                     dilation=2)),
    ("layer_norm", [[7]], {}, lambda x: F.layer_norm(x, [7])),
    ("group_norm", [[3, 6]], {"num_groups": 3}, lambda x: F.group_norm(x, 3)),
    ("cat", [[2, 3], [2, 5]], {"dim": 1}, lambda a, b: torch.cat([a, b], 1)),
    ("stack", [[], []], {"dim": 0}, lambda a, b: torch.stack([a, b])),
]  # fmt: skip


@pytest.mark.parametrize(("name", "shapes", "params", "reference"), CASES)
def test_output_shape_matches_pytorch_beyond_the_generators_ranks(
    name: str, shapes: list[list[int]], params: dict, reference
) -> None:
    """Unbatched windows, non-cubic kernels, rank-1 layer_norm: shapes a given program
    may have though the generator never draws them."""
    expected = tuple(reference(*(torch.randn(s) for s in shapes)).shape)
    assert output_shape(name, shapes, params) == expected


@pytest.mark.parametrize(
    ("name", "shapes", "params", "message"),
    [
        ("add", [[2, 3], [4]], {}, r"add of shapes \[2, 3\] and \[4\]: sizes 3 and 4"),
        ("matmul", [[2, 3], [4, 5]], {}, "sizes 3 and 4 must be equal"),
        ("bmm", [[2, 3], [2, 3, 4]], {}, "`input` must have rank 3, not 2"),
        ("cat", [[2, 3], [2, 3, 1]], {"dim": 0}, "must have one rank"),
        ("softmax", [[]], {"dim": 0}, "rank >= 1, not 0"),
        ("max_pool2d", [[1, 2, 3, 4, 5]], {"kernel_size": 2, "stride": 2, "padding": 0},
         "rank 3 to 4, not 5"),
        ("max_pool1d", [[2, 3, 4]], {"kernel_size": 3, "stride": 1, "padding": 0,
                                     "dilation": 2}, "does not fit size 4"),
        ("avg_pool1d", [[2, 3, 4]], {"kernel_size": 2, "stride": 0, "padding": 0},
         "stride must be >= 1, not 0"),
        ("conv1d", [[2, 3, 9], [4, 2, 3]], {"stride": 1, "padding": 0, "dilation": 1,
                                            "groups": 1}, "sizes 2 and 3 must be equal"),
        ("group_norm", [[2, 6, 4]], {"num_groups": 4}, "does not split into 4"),
        ("nonsense", [[2]], {}, "unknown operator"),
    ],
)  # fmt: skip
def test_shapes_that_do_not_fit_are_a_clear_error(
    name: str, shapes: list[list[int]], params: dict, message: str
) -> None:
    with pytest.raises(ShapeError, match=message):
        output_shape(name, shapes, params)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum"])
def test_number_operands_are_where_pytorch_takes_them(name: str) -> None:
    """The registry lets a Python number stand for a binary operand exactly where PyTorch
    does: either operand of add, sub, mul and div; neither of maximum and minimum."""
    call = REGISTRY[name].call
    fn = getattr(torch, name)
    x = torch.randn(3)
    for position, key in enumerate(("input", "other")):
        args = [x, x]
        args[position] = 2.0
        try:
            fn(*args)
            takes_number = True
        except TypeError:
            takes_number = False
        assert (key in call.numbers) == takes_number
        assert (call.number_error([key]) is None) == takes_number


def test_number_errors_name_the_argument_or_ask_for_a_tensor() -> None:
    add, lerp = REGISTRY["add"].call, REGISTRY["lerp"].call
    assert add.number_error([]) is None and add.number_error(["other"]) is None
    assert "at least one operand must be a tensor" in (add.number_error(["input", "other"]) or "")
    assert lerp.number_error(["weight"]) is None
    assert lerp.number_error(["end"]) == "`end` must be a tensor, not a Python number"
    assert dict(add.params) == {"alpha": 1} == dict(REGISTRY["sub"].call.params)
    assert not REGISTRY["mul"].call.params


@pytest.mark.parametrize("shape", [[3, 4], [2, 1, 5], []])
def test_a_number_operand_is_a_zero_dim_broadcast(shape: list[int]) -> None:
    expected = tuple(torch.sub(0.5, torch.randn(shape)).shape)
    assert output_shape("sub", [[], shape], {}) == expected
    assert output_shape("mul", [shape, []], {}) == expected
    assert output_shape("lerp", [shape, shape, []], {}) == expected
