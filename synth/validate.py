"""Run a program before keeping it: shapes, finiteness, and degeneracy.

A program is kept only when PyTorch agrees with the solver on the shape of *every*
tensor and its values are usable as a verification target:

- it executes (no error), every tensor is finite and below `MAX_ABS` in magnitude (a
  divisor near zero or a long chain of contractions gives values whose comparison
  under a relative tolerance is flaky);
- no output is degenerate in the sense of robust-kbench's filters: an output whose
  elements all lie within `TOL` of one value (a constant kernel would pass), or below
  `TOL` in magnitude (a zero kernel would pass), or one that does not change when any
  single input is redrawn (the kernel could ignore that input).

`real` profiles run the program itself on CPU. `scaled` profiles (the paper's sizes do
not fit a CPU) check shapes on the meta device at full size and values on a
scaled-down copy: the same operators, wiring and parameters with smaller dims (dims
that are 1 stay 1, all others stay >= 2), solved from the same skeleton.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from synth.program import Program

TOL = 1e-3
"""Comparison tolerance (absolute and relative) a verifier is expected to use."""
MAX_ABS = 1e6
"""Largest magnitude any tensor of a kept program may reach."""
GRAD_WITNESS = 1e-2
"""A gradient entry at least this large proves an input matters (see `_unproven_inputs`)."""


@dataclass(frozen=True)
class Rejection:
    reason: str


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one thread, warnings silenced: these tensors are small, extra threads
    only contend (and results must not depend on the thread count)."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch.norm's deprecation notice
            yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def _compile(source: str, tag: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<synth:{tag}>", "exec"), namespace)  # our own generated code
    return namespace


def execute(
    program: Program, seed: int = 0, meta: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the printed program; returns (inputs, every computed tensor in program order).
    `meta` runs it on the meta device (shapes only, any size)."""
    ns = _compile(program.render(return_all=True), "execute")
    with single_threaded(), torch.no_grad():
        torch.manual_seed(seed)
        if meta:
            with torch.device("meta"):
                inputs = ns["get_inputs"]()
        else:
            inputs = ns["get_inputs"]()
        return inputs, ns["fused_operator"](*inputs)


def check_meta_shapes(program: Program) -> Rejection | None:
    """Execute the full-size program on the meta device; compare every tensor's shape."""
    try:
        inputs, computed = execute(program, meta=True)
    except Exception as err:  # any failure rejects the program
        return Rejection(f"meta run failed: {type(err).__name__}: {str(err)[:200]}")
    return _compare_shapes(program, inputs, computed)


def _compare_shapes(
    program: Program, inputs: Sequence[torch.Tensor], computed: Sequence[torch.Tensor]
) -> Rejection | None:
    tensors = [*inputs, *computed]
    if len(tensors) != len(program.shapes):
        return Rejection("wrong number of tensors")
    for i, (t, expected) in enumerate(zip(tensors, program.shapes, strict=True)):
        if tuple(t.shape) != tuple(expected):
            return Rejection(
                f"tensor_{i}: solver says {list(expected)}, torch gives {list(t.shape)}"
            )
        if t.dtype != torch.float32:
            return Rejection(f"tensor_{i}: dtype {t.dtype}")
    return None


def _usable(tensors: Sequence[torch.Tensor]) -> Rejection | None:
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            continue
        if not bool(torch.isfinite(t).all()):
            return Rejection(f"non-finite values (tensor {i})")
        if float(t.abs().max()) > MAX_ABS:
            return Rejection(f"values above {MAX_ABS:g} (tensor {i})")
    return None


def _degenerate(t: torch.Tensor) -> str | None:
    mag = float(t.abs().max())
    if mag <= TOL:
        return "output below tolerance"
    if t.numel() >= 2:
        center = t.reshape(-1).median()
        if bool(((t - center).abs() <= TOL + TOL * center.abs()).all()):
            return "output nearly constant"
    return None


def check_values(program: Program, seed: int) -> Rejection | None:
    """Run the program on real CPU tensors: shapes, finiteness, degeneracy."""
    with single_threaded():
        return _check_values(program, seed)


def _check_values(program: Program, seed: int) -> Rejection | None:
    full = _compile(program.render(return_all=True), "all")
    canonical = _compile(program.source, "canonical")
    gen = torch.Generator().manual_seed(seed + 1)  # redrawn inputs differ from the originals
    torch.manual_seed(seed)
    try:
        inputs = canonical["get_inputs"]()
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        with torch.enable_grad():
            computed = full["fused_operator"](*leaves)
    except Exception as err:
        return Rejection(f"run failed: {type(err).__name__}: {str(err)[:200]}")
    values = [t.detach() for t in computed]
    bad = _compare_shapes(program, inputs, values) or _usable(values)
    if bad:
        return bad
    position = {n.output: i for i, n in enumerate(program.nodes)}
    outputs = [values[position[t]] for t in program.outputs]
    for k, out in enumerate(outputs):
        why = _degenerate(out)
        if why:
            return Rejection(f"{why} (output {k})")

    run: Callable[..., list[torch.Tensor]] = canonical["fused_operator"]
    # A second random case for the canonical source: all inputs redrawn.
    bad = _rerun(run, [torch.randn(x.shape, generator=gen) for x in inputs], outputs)
    if isinstance(bad, Rejection):
        return bad
    if bad:
        return Rejection("outputs insensitive to the inputs")
    for i in _unproven_inputs(program, leaves, computed, position, gen):
        redrawn = list(inputs)
        redrawn[i] = torch.randn(inputs[i].shape, generator=gen)
        bad = _rerun(run, redrawn, outputs)
        if isinstance(bad, Rejection):
            return bad
        if bad:
            return Rejection(f"outputs insensitive to input {i}")
    return None


def _rerun(
    run: Callable[..., list[torch.Tensor]], inputs: list[torch.Tensor], before: list[torch.Tensor]
) -> Rejection | bool:
    """Run on new inputs: a Rejection if unusable, else whether nothing changed."""
    try:
        with torch.no_grad():
            again = run(*inputs)
    except Exception as err:
        return Rejection(f"run failed on new inputs: {type(err).__name__}")
    bad = _usable(again)
    if bad:
        return bad
    return all(torch.allclose(a, b, atol=TOL, rtol=TOL) for a, b in zip(before, again, strict=True))


def _unproven_inputs(
    program: Program,
    leaves: list[torch.Tensor],
    computed: Sequence[torch.Tensor],
    position: dict[int, int],
    gen: torch.Generator,
) -> list[int]:
    """Inputs whose influence on the outputs a single backward pass does not show.

    The gradient of a random projection of the outputs is a cheap witness: an input with
    a clearly non-zero gradient changes some output. Inputs that reach the outputs only
    through argmax-like paths (no gradient), or with a tiny gradient, are left for the
    slower redraw test.
    """
    outs = [computed[position[t]] for t in program.outputs]
    terms = [(o * torch.randn(o.shape, generator=gen)).sum() for o in outs if o.requires_grad]
    if not terms:
        return list(range(len(leaves)))
    try:
        grads = torch.autograd.grad(sum(terms), leaves, allow_unused=True)
    except RuntimeError:
        return list(range(len(leaves)))
    unproven = []
    for i, g in enumerate(grads):
        if g is None or not bool(torch.isfinite(g).all()) or float(g.abs().max()) < GRAD_WITNESS:
            unproven.append(i)
    return unproven
