"""Property tests of every shape rule: the solver's shapes are the shapes PyTorch produces.

Each test pins ranks and parameters of a small DAG, lets the pipeline solve the dims
(tiny profile), runs the printed program on CPU tensors, and compares the shape of every
tensor with the solver's. Broadcasting is exercised for every rank pair, reductions with
keepdim both ways, windows over kernel/stride/padding/dilation/groups/output_padding.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from synth.dag import Dag
from synth.profiles import TINY
from tests.synth.helpers import solve_dag, torch_shapes

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)
seeds = st.integers(0, 2**20)


def check(cand) -> None:
    assert cand is not None
    program = cand.program
    assert torch_shapes(program) == [tuple(s) for s in program.shapes]
    for shape in program.shapes:
        assert all(1 <= d <= TINY.max_dim for d in shape)


@pytest.mark.parametrize(("ra", "rb"), list(itertools.product(range(6), repeat=2)))
def test_broadcast_every_rank_pair(ra: int, rb: int) -> None:
    out = max(ra, rb)
    patterns = [[[] for _ in range(out)]]  # all shared dims equal
    # and every shared position broadcasting one side or the other
    shared = min(ra, rb)
    patterns.append([[] for _ in range(out - shared)] + [[p % 2] for p in range(shared)])
    for i, pattern in enumerate(patterns):
        cand = solve_dag(
            Dag.single("sub"), i, ranks={0: ra, 1: rb}, params={0: {"_broadcast": pattern}}
        )
        check(cand)
        shapes = cand.program.shapes
        assert len(shapes[2]) == out
        if i == 1 and shared:
            # a side forced to 1 at a shared position really is 1 there
            a, b = shapes[0][::-1], shapes[1][::-1]
            assert any(a[k] == 1 or b[k] == 1 for k in range(shared))


@SETTINGS
@given(
    op=st.sampled_from(["add", "mul", "div", "maximum", "minimum", "lerp"]),
    ranks=st.lists(st.integers(0, 5), min_size=3, max_size=3),
    seed=seeds,
)
def test_broadcast_binary_and_lerp(op: str, ranks: list[int], seed: int) -> None:
    arity = 3 if op == "lerp" else 2
    cand = solve_dag(Dag.single(op), seed, ranks=dict(enumerate(ranks[:arity])))
    check(cand)


@pytest.mark.parametrize(("ra", "rb"), list(itertools.product(range(2, 6), repeat=2)))
def test_matmul_every_rank_pair(ra: int, rb: int) -> None:
    check(solve_dag(Dag.single("matmul"), ra * 7 + rb, ranks={0: ra, 1: rb}))


def test_bmm() -> None:
    for seed in range(3):
        check(solve_dag(Dag.single("bmm"), seed))


@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax", "argmin", "var", "norm"])
def test_reductions_keepdim_both_ways(op: str, keepdim: bool) -> None:
    for rank in range(1, 6):
        dim = (rank * 3 + len(op)) % rank
        out = rank if keepdim else rank - 1
        cand = solve_dag(
            Dag.single(op),
            rank,
            ranks={0: rank, 1: out},
            params={0: {"dim": dim, "keepdim": keepdim}},
        )
        check(cand)
        x, y = cand.program.shapes[0], cand.program.shapes[1]
        assert x[dim] >= 2  # a reduced axis is never trivial
        assert y == (x[:dim] + (1,) + x[dim + 1 :] if keepdim else x[:dim] + x[dim + 1 :])


@SETTINGS
@given(
    op=st.sampled_from(["softmax", "log_softmax", "cumsum", "cummax", "cummin"]),
    rank=st.integers(1, 5),
    data=st.data(),
    seed=seeds,
)
def test_axis_operators(op: str, rank: int, data: st.DataObject, seed: int) -> None:
    dim = data.draw(st.integers(0, rank - 1))
    check(solve_dag(Dag.single(op), seed, ranks={0: rank}, params={0: {"dim": dim}}))


@SETTINGS
@given(op=st.sampled_from(["cat", "stack"]), rank=st.integers(0, 5), data=st.data(), seed=seeds)
def test_cat_and_stack_every_axis(op: str, rank: int, data: st.DataObject, seed: int) -> None:
    assume(op == "stack" or rank >= 1)
    assume(op == "cat" or rank <= 4)
    dim = data.draw(st.integers(0, rank if op == "stack" else rank - 1))
    out = rank + 1 if op == "stack" else rank
    cand = solve_dag(
        Dag.single(op), seed, ranks={0: rank, 1: rank, 2: out}, params={0: {"dim": dim}}
    )
    check(cand)
    a, b, y = cand.program.shapes
    if op == "cat":
        assert y[dim] == a[dim] + b[dim]
    else:
        assert y[dim] == 2 and a == b


@pytest.mark.parametrize("op", ["transpose", "triu", "tril"])
@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_layout_ranks(op: str, rank: int) -> None:
    check(solve_dag(Dag.single(op), rank, ranks={0: rank}))


@SETTINGS
@given(
    op=st.sampled_from(["batch_norm", "layer_norm", "group_norm", "instance_norm"]),
    rank=st.integers(2, 5),
    data=st.data(),
    seed=seeds,
)
def test_normalisation(op: str, rank: int, data: st.DataObject, seed: int) -> None:
    assume(op in ("batch_norm", "layer_norm") or rank >= 3)
    params = {}
    if op == "layer_norm":
        params["k"] = data.draw(st.integers(2, min(4, rank)))
    if op == "group_norm":
        params["num_groups"] = data.draw(st.sampled_from(TINY.norm_groups))
    cand = solve_dag(Dag.single(op), seed, ranks={0: rank}, params={0: params})
    check(cand)
    if op == "group_norm":
        assert cand.program.shapes[0][1] % params["num_groups"] == 0


kernels = st.integers(*TINY.kernel_sizes)
strides = st.integers(*TINY.strides)
dilations = st.integers(*TINY.dilations)


@SETTINGS
@given(
    kind=st.sampled_from(["avg", "max"]),
    n=st.integers(1, 3),
    k=kernels,
    s=strides,
    d=dilations,
    data=st.data(),
    seed=seeds,
)
def test_pooling_output_sizes(
    kind: str, n: int, k: int, s: int, d: int, data: st.DataObject, seed: int
) -> None:
    params = {"kernel_size": k, "stride": s, "padding": data.draw(st.integers(0, k // 2))}
    if kind == "max":
        params["dilation"] = d
    cand = solve_dag(Dag.single(f"{kind}_pool{n}d"), seed, params={0: params})
    assume(cand is not None)
    check(cand)


@SETTINGS
@given(
    n=st.integers(1, 3),
    transposed=st.booleans(),
    k=kernels,
    s=strides,
    d=dilations,
    g=st.sampled_from(TINY.conv_groups),
    data=st.data(),
    seed=seeds,
)
def test_convolution_output_sizes(
    n: int, transposed: bool, k: int, s: int, d: int, g: int, data: st.DataObject, seed: int
) -> None:
    params = {
        "kernel_size": k,
        "stride": s,
        "dilation": d,
        "groups": g,
        "padding": data.draw(st.integers(0, d * (k - 1) // 2)),
    }
    if transposed:
        params["output_padding"] = data.draw(st.integers(0, max(s, d) - 1))
    name = f"conv_transpose{n}d" if transposed else f"conv{n}d"
    cand = solve_dag(Dag.single(name), seed, params={0: params})
    assume(cand is not None)
    check(cand)
    x, w, _ = cand.program.shapes
    cin = x[1]
    assert cin % g == 0
    if transposed:
        assert w[0] == cin
    else:
        assert w[1] * g == cin and w[0] % g == 0
    assert w[2:] == (k,) * n


@SETTINGS
@given(
    ops=st.lists(
        st.sampled_from(
            ["relu", "conv2d", "max_pool2d", "sum", "matmul", "add", "layer_norm", "cat"]
        ),
        min_size=2,
        max_size=5,
    ),
    seed=seeds,
)
def test_chains_share_dims_consistently(ops: list[str], seed: int) -> None:
    cand = solve_dag(Dag.chain(ops), seed)
    assume(cand is not None)
    check(cand)
