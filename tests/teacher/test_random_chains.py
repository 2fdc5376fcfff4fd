"""Fusion against randomly composed chains, not the generator's output only.

Each chain is (an elementwise prologue over two inputs that broadcast) x (one
reduction, softmax, scan, normalisation or pooling operator) x (an elementwise
epilogue: a unary function, a broadcast third input, triu/tril where the rank
allows). The teacher fuses the three into one kernel, so each chain exercises the
prologue's loads, the anchor's indexing and the epilogue's coordinates together.
A chain the teacher refuses must be refused with a `TranslationError`; a chain it
translates must match PyTorch.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from synth.teacher import TranslationError, translate
from synth.teacher.check import check_candidate

from .conftest import DEVICE
from .programs import render

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BINARY = ("add", "sub", "mul", "maximum", "minimum")
UNARY = ("torch.relu", "torch.tanh", "torch.sigmoid", "torch.abs", "F.silu", "F.gelu")
ANCHORS = ("reduction", "softmax", "scan", "norm", "pool")


def _broadcast_pair(rng: random.Random, full: list[int]) -> tuple[list[int], list[int]]:
    """Two shapes that broadcast to exactly `full`: one of full rank, one a suffix."""
    first = [1 if rng.random() < 0.35 else size for size in full]
    suffix = rng.randint(1, len(full))
    second = [1 if rng.random() < 0.35 else size for size in full[len(full) - suffix :]]
    for i, size in enumerate(full):  # each dim must come from one of them
        j = i - (len(full) - suffix)
        if first[i] != size and (j < 0 or second[j] != size):
            first[i] = size
    return (first, second) if rng.random() < 0.5 else (second, first)


def _sizes(rng: random.Random, rank: int, low: int = 2, high: int = 6) -> list[int]:
    return [rng.randint(low, high) for _ in range(rank)]


def _pool(rng: random.Random) -> tuple[list[int], str, int]:
    """A pooling call on `{x}` with valid parameters: (input shape, call, output rank)."""
    nd = rng.choice((1, 2))
    kind = rng.choice(("max", "avg"))
    kernel = rng.randint(1, 4)
    dilation = rng.randint(1, 3) if kind == "max" else 1
    span = dilation * (kernel - 1) + 1
    padding = rng.randint(0, kernel // 2)  # PyTorch's bound, for max and avg alike
    stride = rng.randint(1, 3)
    lead = _sizes(rng, rng.choice((1, 2)), 1, 3)
    spatial = [rng.randint(span, span + 5) for _ in range(nd)]
    if not all(_windows_touch_input(size, kernel, stride, padding, dilation) for size in spatial):
        padding = 0  # a window wholly in padding is -inf in PyTorch: no test of fusion
    params = f"kernel_size={kernel}, stride={stride}, padding={padding}"
    if kind == "max":
        params += f", dilation={dilation}"
    return lead + spatial, f"F.{kind}_pool{nd}d({{x}}, {params})", len(lead) + nd


def _windows_touch_input(size: int, kernel: int, stride: int, padding: int, dilation: int) -> bool:
    """Whether every pooling window reads at least one element of the input."""
    outputs = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return all(
        any(0 <= o * stride - padding + k * dilation < size for k in range(kernel))
        for o in range(outputs)
    )


def _anchor(rng: random.Random, family: str) -> tuple[list[int], str, int]:
    """An anchor call on `{x}`: (its input shape, the call, its output rank)."""
    if family == "reduction":
        shape = _sizes(rng, rng.randint(1, 4))
        dim, keepdim = rng.randrange(len(shape)), rng.random() < 0.5
        name = rng.choice(("sum", "mean", "max", "min", "argmax", "var", "norm"))
        suffix = {"max": ".values", "min": ".values", "argmax": ".float()"}.get(name, "")
        call = f"torch.{name}({{x}}, dim={dim}, keepdim={keepdim}){suffix}"
        return shape, call, len(shape) - (not keepdim)
    if family == "softmax":
        shape = _sizes(rng, rng.randint(1, 3))
        name = rng.choice(("softmax", "log_softmax"))
        return shape, f"torch.{name}({{x}}, dim={rng.randrange(len(shape))})", len(shape)
    if family == "scan":
        shape = _sizes(rng, rng.randint(1, 3))
        name, suffix = rng.choice((("cumsum", ""), ("cummax", ".values"), ("cummin", ".values")))
        return shape, f"torch.{name}({{x}}, dim={rng.randrange(len(shape))}){suffix}", len(shape)
    if family == "norm":
        kind = rng.choice(("layer_norm", "group_norm", "instance_norm", "batch_norm"))
        shape = _sizes(rng, 3)
        if kind == "layer_norm":
            normalized = shape[-rng.randint(1, 2) :]
            return shape, f"F.layer_norm({{x}}, normalized_shape={normalized})", 3
        if kind == "group_norm":
            groups = rng.choice((1, 2))
            shape[1] = groups * rng.randint(1, 3)
            return shape, f"F.group_norm({{x}}, num_groups={groups})", 3
        if kind == "instance_norm":
            return shape, "F.instance_norm({x})", 3
        stats = f"torch.zeros({shape[1]}, device={{x}}.device), "
        stats += f"torch.ones({shape[1]}, device={{x}}.device)"
        return shape, f"F.batch_norm({{x}}, {stats}, training=True)", 3
    return _pool(rng)


def _output_shape(full: list[int], anchor: str) -> list[int]:
    """The anchor's output shape, from PyTorch itself."""
    x = torch.randn(full)
    return list(eval(anchor.format(x="x"), {"torch": torch, "F": F, "x": x}).shape)


def random_chain(seed: int, family: str | None = None) -> str:
    """One prologue x anchor x epilogue program, drawn from `seed`."""
    rng = random.Random(seed)
    family = family or rng.choice(ANCHORS)
    full, anchor, out_rank = _anchor(rng, family)
    inputs = list(_broadcast_pair(rng, full))
    epilogue = rng.sample(["unary", "bias", "triangle"], rng.randint(1, 2))
    if "bias" in epilogue:  # a third input broadcast against the anchor's output
        out = _output_shape(full, anchor) or [1]
        suffix = rng.randint(1, len(out))
        inputs.append([1 if rng.random() < 0.3 else size for size in out[len(out) - suffix :]])

    def last() -> str:
        return f"{{{len(inputs) + len(calls) - 1}}}"

    calls = [f"torch.{rng.choice(BINARY)}({{0}}, {{1}})"]
    if rng.random() < 0.4:
        calls.append(f"{rng.choice(UNARY)}({last()})")
    calls.append(anchor.format(x=last()))
    for kind in epilogue:
        if kind == "unary":
            calls.append(f"{rng.choice(UNARY)}({last()})")
        elif kind == "triangle" and out_rank >= 2:
            side = rng.choice(("triu", "tril"))
            calls.append(f"torch.{side}({last()}, diagonal={rng.randint(-1, 1)})")
        elif kind == "bias":
            calls.append(f"torch.{rng.choice(BINARY)}({last()}, {{2}})")
    return render(inputs, calls)


def _check_chain(seed: int, family: str | None = None) -> bool:
    """Translate and check one chain; True when translated (and then correct)."""
    source = random_chain(seed, family)
    try:
        translation = translate(source)
    except TranslationError:
        return False
    result = check_candidate(source, translation.code, seeds=(0,), device=DEVICE)
    assert result.correct, (
        f"{result.message}\n--- problem\n{source}\n--- candidate\n{translation.code}"
    )
    return True


@pytest.mark.parametrize(
    ("family", "seed"), [(family, seed) for family in ANCHORS for seed in range(3)]
)
def test_random_chain(family: str, seed: int) -> None:
    _check_chain(1000 * ANCHORS.index(family) + seed, family)


def test_random_chains_mostly_translate() -> None:
    """The sample is not vacuous: the teacher translates most chains (checked above)."""
    refused = []
    for family in ANCHORS:
        for seed in range(3):
            try:
                translate(random_chain(1000 * ANCHORS.index(family) + seed, family))
            except TranslationError as err:
                refused.append(f"{family}/{seed}: {err}")
    assert len(refused) <= 2, refused


def test_chains_fuse_into_one_kernel() -> None:
    """Prologue, anchor and epilogue share a kernel (a norm may add its moments kernel)."""
    translation = translate(random_chain(7, "pool"))
    assert len(translation.kernels) == 1


@pytest.mark.parametrize("seed", range(100, 200))
def test_random_chain_any_family(seed: int) -> None:
    _check_chain(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200, 1200))
def test_random_chain_more(seed: int) -> None:
    _check_chain(seed)
