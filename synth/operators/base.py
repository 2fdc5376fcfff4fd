"""What one operator is: arity, rank rule, parameter choices, shape rule, FLOPs, printing.

An `Operator` is plain data plus small pure functions, so adding one is a single entry
in a group module (and a test). The same entry serves every stage:

- `rank_rule(in_ranks)` lists the output ranks (and rank-changing choices such as
  `keepdim`) the operator allows; the rank solver enumerates it once into a table.
- `sample_params(ctx)` draws the remaining discrete choices (reduction axis, kernel,
  stride, groups, broadcast pattern, ...) once ranks are known.
- `shape(m, ins, params)` states the shape rule on symbolic dims (`synth.dims`) and
  returns the output dims; it is the only shape logic, so the solver and the printed
  program cannot disagree.
- `flops(ins, outs, params)` returns `(coef, factors)` with FLOPs = coef * prod(factors);
  it works on symbolic dims (for the solver) and on ints (for records) alike.
- `render(args, params, in_shapes)` prints the canonical call expression.
- `call` (`synth.operators.call.Call`) states every way a program may write the call,
  for readers of programs; `synth.operators.infer.output_shape` runs `shape` on known
  sizes for them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from synth.dims import Atom, DimSystem
from synth.operators.call import Call
from synth.profiles import MAX_RANK, Profile

T = TypeVar("T")
Params = dict[str, Any]
RankRule = Callable[[tuple[int, ...]], Iterable[tuple[int, Params]]]
FlopsRule = Callable[[Sequence[Sequence[Any]], Sequence[Any], Params], tuple[int, list[Any]]]

BROADCAST_ONE_PROB = 0.2
"""Chance that an aligned position shared by several inputs makes some of them size 1."""


@dataclass(frozen=True)
class ParamContext:
    """What an operator may look at when drawing its discrete parameters."""

    rng: random.Random
    in_ranks: tuple[int, ...]
    out_rank: int
    rank_params: Params
    profile: Profile
    fixed: tuple[tuple[int | None, ...], ...] = ()
    """Per input, per dim: its value if earlier operators already pinned it (a size-1
    dim, a kernel size, a stacked 2), else None. Lets an operator avoid choices that
    would contradict them, e.g. reducing over an axis that is already 1."""
    attempt: int = 0
    """How many draws of this operator's parameters already contradicted the program;
    later draws lean toward forgiving choices (broadcasting, size-preserving windows)."""

    def leniency(self) -> float:
        """0 on the first draw, approaching 1 on the last ones."""
        return min(1.0, self.attempt / 4)

    def fixed_dim(self, i: int, d: int) -> int | None:
        return self.fixed[i][d] if self.fixed else None


@dataclass(frozen=True)
class Operator:
    name: str
    group: str
    arity: int
    rank_rule: RankRule
    shape: Callable[[DimSystem, list[list[Atom]], Params], list[Atom]]
    flops: FlopsRule
    render: Callable[[Sequence[str], Params, Sequence[Sequence[int]]], str]
    sample_params: Callable[[ParamContext], Params] = field(default=lambda ctx: {})
    weight_slots: tuple[int, ...] = ()
    """Input slots that always read a fresh program input (conv weights), never a
    computed tensor."""
    call: Call | None = None
    """How programs may write the operator (names, arguments, defaults): what a reader
    of programs recognises; `render` prints its canonical form."""
    aten: tuple[str, ...] = ()
    """ATen operators (overload packet names) other than `name` that compute it, for
    readers of exported graphs (`synth.kernelbench`): `amax` is `max`."""

    @cached_property
    def rank_table(self) -> tuple[tuple[tuple[int, ...], Params], ...]:
        """Every allowed (input ranks..., output rank) with its rank-changing params."""
        rows = []
        for ins in itertools.product(range(MAX_RANK + 1), repeat=self.arity):
            for out, rparams in self.rank_rule(ins):
                if 0 <= out <= MAX_RANK:
                    rows.append(((*ins, out), dict(rparams)))
        return tuple(rows)

    def flop_count(
        self, in_shapes: Sequence[Sequence[int]], out: Sequence[int], params: Params
    ) -> int:
        coef, factors = self.flops(in_shapes, out, params)
        total = coef
        for f in factors:
            total *= f
        return total

    @staticmethod
    def bytes_moved(in_shapes: Sequence[Sequence[int]], out: Sequence[int]) -> int:
        """Bytes an eager implementation reads and writes (float32)."""
        return 4 * (sum(numel(s) for s in in_shapes) + numel(out))


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- rank rules ------------------------------------------------------------------------------
def same_rank(lo: int = 0, hi: int = MAX_RANK) -> RankRule:
    """Unary, shape-preserving: output rank = input rank, input rank in [lo, hi]."""

    def rule(ins: tuple[int, ...]) -> Iterable[tuple[int, Params]]:
        if all(r == ins[0] for r in ins) and lo <= ins[0] <= hi:
            yield ins[0], {}

    return rule


def broadcast_rank(lo: int = 0) -> RankRule:
    def rule(ins: tuple[int, ...]) -> Iterable[tuple[int, Params]]:
        if min(ins) >= lo:
            yield max(ins), {}

    return rule


def reduce_rank(ins: tuple[int, ...]) -> Iterable[tuple[int, Params]]:
    (r,) = ins
    if r >= 1:
        yield r, {"keepdim": True}
        yield r - 1, {"keepdim": False}


def exact_rank(rank: int) -> RankRule:
    def rule(ins: tuple[int, ...]) -> Iterable[tuple[int, Params]]:
        if all(r == rank for r in ins):
            yield rank, {}

    return rule


# -- parameter helpers -----------------------------------------------------------------------
def pick_axis(ctx: ParamContext, axes: Sequence[int], input_index: int = 0) -> int:
    """A random axis among `axes`, preferring those not already pinned to size 1."""
    open_axes = [a for a in axes if ctx.fixed_dim(input_index, a) != 1]
    return ctx.rng.choice(open_axes or list(axes))


def broadcast_params(ctx: ParamContext, ranks: Sequence[int] | None = None) -> Params:
    """A broadcast pattern; retries (after a contradiction) broadcast more often."""
    one_prob = BROADCAST_ONE_PROB + (0.9 - BROADCAST_ONE_PROB) * ctx.leniency()
    return {
        "_broadcast": broadcast_pattern(ctx.rng, ctx.in_ranks if ranks is None else ranks, one_prob)
    }


def pick_dim(ctx: ParamContext) -> Params:
    return {"dim": pick_axis(ctx, range(ctx.in_ranks[0]))}


def pick_divisor(ctx: ParamContext, choices: Sequence[int], whole: int | None) -> int:
    """A random choice that divides `whole` when `whole` is already pinned."""
    fitting = [g for g in choices if whole is None or whole % g == 0]
    return ctx.rng.choice(fitting or [1])


def broadcast_pattern(
    rng: random.Random, ranks: Sequence[int], one_prob: float = BROADCAST_ONE_PROB
) -> list[list[int]]:
    """For each aligned output position, the inputs forced to size 1 there.

    Positions an input lacks (lower rank) broadcast implicitly; where several inputs share
    a position they are equal, except that with probability `one_prob` a random
    non-empty proper subset of them is size 1 instead.
    """
    out_rank = max(ranks, default=0)
    pattern: list[list[int]] = []
    for p in range(out_rank):
        present = [i for i, r in enumerate(ranks) if r >= out_rank - p]
        forced: list[int] = []
        if len(present) > 1 and rng.random() < one_prob:
            k = rng.randint(1, len(present) - 1)
            forced = sorted(rng.sample(present, k))
        pattern.append(forced)
    return pattern


def broadcast_dims(
    m: DimSystem, ins: Sequence[Sequence[Atom]], pattern: Sequence[Sequence[int]] | None
) -> list[Atom]:
    """Right-aligned broadcasting with the given pattern of size-1 inputs (None: none
    forced, PyTorch's rule alone)."""
    out_rank = max((len(s) for s in ins), default=0)
    out: list[Atom] = []
    for p in range(out_rank):
        rest: list[Atom] = []
        for i, s in enumerate(ins):
            if len(s) >= out_rank - p:
                d = s[len(s) - out_rank + p]
                if pattern is not None and i in pattern[p]:
                    m.unify(d, m.ONE)
                elif m.fixed(d) != 1:
                    rest.append(d)
        # a dim already pinned to 1 simply broadcasts
        if not rest:
            rest = [m.ONE]
        for d in rest[1:]:
            m.unify(rest[0], d)
        out.append(rest[0])
    return out


def elementwise_flops(coef: int) -> FlopsRule:
    """`coef` FLOPs per output element."""

    def flops(ins: Sequence[Sequence[T]], out: Sequence[T], params: Params) -> tuple[int, list[T]]:
        return coef, list(out)

    return flops


def input_flops(coef: int) -> FlopsRule:
    """`coef` FLOPs per element of the (first) input."""

    def flops(ins: Sequence[Sequence[T]], out: Sequence[T], params: Params) -> tuple[int, list[T]]:
        return coef, list(ins[0])

    return flops


def template(fmt: str) -> Callable[[Sequence[str], Params, Sequence[Sequence[int]]], str]:
    """Print by a format string over the argument names (`{0}`, `{1}`, ...) and params."""

    def render(args: Sequence[str], params: Params, in_shapes: Sequence[Sequence[int]]) -> str:
        return fmt.format(*args, **params)

    return render
