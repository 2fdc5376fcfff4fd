"""Symbolic tensor dimensions: union-find over dimension atoms plus linear relations.

Once ranks and every discrete parameter of a program are fixed, all of its shape rules
are either equalities between dimensions (elementwise ops, matmul's contracted dim,
cat's off-axis dims, ...) or linear relations (`out = a + b` for cat, the conv/pool
output-size formulas with constant kernel/stride/padding/dilation, `C = G * c` for
groups). Equalities are merged here by union-find, so the CP-SAT model that follows
holds one variable per *class* of equal dimensions instead of one per tensor axis; the
few linear relations are kept as they are. Each derived atom also remembers how to
compute it forward from its inputs, which lets the solver's randomised hint be built
by simply evaluating the program.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

Atom = int
"""A dimension handle; atoms that are unified share one value."""


class Conflict(Exception):
    """The structural choices of a program contradict each other (e.g. a dim that must be
    1 and at least 2). The caller draws new choices."""


@dataclass(frozen=True)
class Linear:
    """lo <= sum(coef * atom) <= hi (either bound may be None)."""

    terms: tuple[tuple[int, Atom], ...]
    lo: int | None
    hi: int | None


@dataclass
class DimSystem:
    """Mutable builder used while an operator sequence states its shape rules."""

    parent: list[int] = field(default_factory=lambda: [0])
    lo: list[int] = field(default_factory=lambda: [1])
    hi: list[int | None] = field(default_factory=lambda: [1])
    mult: list[int] = field(default_factory=lambda: [1])
    relations: list[Linear] = field(default_factory=list)
    defs: list[tuple[Atom, Callable[..., int], tuple[Atom, ...]]] = field(default_factory=list)
    _consts: dict[int, Atom] = field(default_factory=lambda: {1: 0})

    ONE: ClassVar[Atom] = 0
    """The atom fixed to 1 (broadcast dims, keepdim dims)."""

    # -- atoms ---------------------------------------------------------------------------
    def new(self, lo: int = 1) -> Atom:
        self.parent.append(len(self.parent))
        self.lo.append(lo)
        self.hi.append(None)
        self.mult.append(1)
        return len(self.parent) - 1

    def const(self, value: int) -> Atom:
        if value < 1:
            raise Conflict(f"dimension constant {value} < 1")
        atom = self._consts.get(value)
        if atom is None:
            atom = self.new(value)
            self.hi[atom] = value
            self._consts[value] = atom
        return atom

    def find(self, a: Atom) -> Atom:
        parent = self.parent
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def fixed(self, a: Atom) -> int | None:
        """The value of `a` if it is already pinned (constants, size-1 dims), else None."""
        r = self.find(a)
        return self.lo[r] if self.hi[r] == self.lo[r] else None

    # -- constraints ---------------------------------------------------------------------
    def unify(self, a: Atom, b: Atom) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.lo[ra] = max(self.lo[ra], self.lo[rb])
        his = [h for h in (self.hi[ra], self.hi[rb]) if h is not None]
        self.hi[ra] = min(his) if his else None
        self.mult[ra] = math.lcm(self.mult[ra], self.mult[rb])
        self._check(ra)

    def at_least(self, a: Atom, value: int) -> None:
        r = self.find(a)
        self.lo[r] = max(self.lo[r], value)
        self._check(r)

    def _check(self, r: Atom) -> None:
        hi = self.hi[r]
        if hi is not None and (self.lo[r] > hi or hi % self.mult[r]):
            raise Conflict("dimension bounds contradict")

    def linear(self, terms: Sequence[tuple[int, Atom]], lo: int | None, hi: int | None) -> None:
        self.relations.append(Linear(tuple(terms), lo, hi))

    def define(self, atom: Atom, fn: Callable[..., int], deps: Sequence[Atom]) -> None:
        """How to compute `atom` forward from `deps` (used only to build solver hints)."""
        self.defs.append((atom, fn, tuple(deps)))

    # -- derived dimensions --------------------------------------------------------------
    def add(self, a: Atom, b: Atom) -> Atom:
        """A new dim equal to a + b (cat along an axis)."""
        out = self.new(2)
        self.linear(((1, out), (-1, a), (-1, b)), 0, 0)
        self.define(out, lambda x, y: x + y, (a, b))
        return out

    def split(self, whole: Atom, parts: int) -> Atom:
        """A new dim c with whole == parts * c (channels per group)."""
        if parts == 1:
            return whole
        r = self.find(whole)
        self.mult[r] = math.lcm(self.mult[r], parts)
        self._check(r)
        c = self.new()
        self.linear(((1, whole), (-parts, c)), 0, 0)
        self.define(c, lambda w: max(1, w // parts), (whole,))
        return c

    def scale(self, part: Atom, parts: int) -> Atom:
        """A new dim equal to parts * part (output channels of a grouped conv)."""
        if parts == 1:
            return part
        whole = self.new(parts)
        self.mult[whole] = parts
        self.linear(((1, whole), (-parts, part)), 0, 0)
        self.define(whole, lambda p: parts * p, (part,))
        return whole

    def window(self, size: Atom, kernel: int, stride: int, padding: int, dilation: int) -> Atom:
        """Output length of a convolution/pooling window:
        floor((size + 2p - d(k-1) - 1) / s) + 1, as two linear inequalities."""
        reach = dilation * (kernel - 1)
        self.at_least(size, max(1, reach + 1 - 2 * padding))
        out = self.new()
        # size - stride*out lies in [reach + 1 - 2p - s, reach - 2p]
        self.linear(
            ((1, size), (-stride, out)),
            reach + 1 - 2 * padding - stride,
            reach - 2 * padding,
        )
        self.define(out, lambda n: max(1, (n + 2 * padding - reach - 1) // stride + 1), (size,))
        return out

    def transposed_window(
        self, size: Atom, kernel: int, stride: int, padding: int, dilation: int, out_pad: int
    ) -> Atom:
        """Output length of a transposed convolution: (n-1)s - 2p + d(k-1) + op + 1."""
        offset = -stride - 2 * padding + dilation * (kernel - 1) + out_pad + 1
        out = self.new()
        self.linear(((1, out), (-stride, size)), offset, offset)
        self.define(out, lambda n: max(1, stride * n + offset), (size,))
        return out

    # -- transactions --------------------------------------------------------------------
    def snapshot(self) -> tuple:
        """State to `restore` if the next operator's choices turn out to conflict."""
        return (
            list(self.parent),
            list(self.lo),
            list(self.hi),
            list(self.mult),
            len(self.relations),
            len(self.defs),
            dict(self._consts),
        )

    def restore(self, state: tuple) -> None:
        parent, lo, hi, mult, n_rel, n_defs, consts = state
        self.parent, self.lo, self.hi, self.mult = list(parent), list(lo), list(hi), list(mult)
        del self.relations[n_rel:]
        del self.defs[n_defs:]
        self._consts = dict(consts)

    def freeze(self) -> DimProblem:
        return DimProblem.build(self)

    def feasible(self, max_dim: int) -> bool:
        """Whether the relations so far can still hold with every dim in [1, max_dim]
        (interval propagation: a necessary condition, cheap enough to ask per operator)."""
        try:
            pb = self.freeze()
            los = list(pb.lo)
            his = [max_dim if h is None else min(h, max_dim) for h in pb.hi]
            if any(a > b for a, b in zip(los, his, strict=True)):
                return False
            tighten(los, his, pb.relations)
        except Conflict:
            return False
        return True


@dataclass(frozen=True)
class DimProblem:
    """The merged system: one entry per class of equal dims ("root"), in creation order."""

    atom_root: tuple[int, ...]
    """Atom -> root index."""
    lo: tuple[int, ...]
    hi: tuple[int | None, ...]
    mult: tuple[int, ...]
    relations: tuple[tuple[tuple[tuple[int, int], ...], int | None, int | None], ...]
    """Linear relations over root indices, constants folded into the bounds."""
    defs: tuple[tuple[int, Callable[..., int], tuple[int, ...]], ...]

    @property
    def n_roots(self) -> int:
        return len(self.lo)

    def is_const(self, r: int) -> bool:
        return self.hi[r] is not None and self.hi[r] == self.lo[r]

    @staticmethod
    def build(system: DimSystem) -> DimProblem:
        root_index: dict[int, int] = {}
        atom_root = []
        for a in range(len(system.parent)):
            r = system.find(a)
            if r not in root_index:
                root_index[r] = len(root_index)
            atom_root.append(root_index[r])
        roots = sorted(root_index, key=root_index.__getitem__)
        lo = tuple(system.lo[r] for r in roots)
        hi = tuple(system.hi[r] for r in roots)
        mult = tuple(system.mult[r] for r in roots)
        relations = []
        for rel in system.relations:
            merged: dict[int, int] = {}
            shift = 0
            for coef, atom in rel.terms:
                r = atom_root[atom]
                if hi[r] is not None and hi[r] == lo[r]:
                    shift += coef * lo[r]
                else:
                    merged[r] = merged.get(r, 0) + coef
            terms = tuple((c, r) for r, c in merged.items() if c)
            rlo = None if rel.lo is None else rel.lo - shift
            rhi = None if rel.hi is None else rel.hi - shift
            if not terms:
                if (rlo is not None and rlo > 0) or (rhi is not None and rhi < 0):
                    raise Conflict("constant relation violated")
                continue
            relations.append((terms, rlo, rhi))
        defs = tuple(
            (atom_root[a], fn, tuple(atom_root[d] for d in deps)) for a, fn, deps in system.defs
        )
        return DimProblem(tuple(atom_root), lo, hi, mult, tuple(relations), defs)


def tighten(los: list[int], his: list[int], relations: Sequence, passes: int = 4) -> None:
    """Interval bound propagation over the linear relations, in place. Catches most
    infeasible skeletons (e.g. a window output forced to 1 that needs a size-0 input)
    without calling the solver, and gives the hint tighter ranges."""
    for _ in range(passes):
        changed = False
        for terms, rlo, rhi in relations:
            # min/max of the sum of all terms
            mins = [c * (los[r] if c > 0 else his[r]) for c, r in terms]
            maxs = [c * (his[r] if c > 0 else los[r]) for c, r in terms]
            smin, smax = sum(mins), sum(maxs)
            if (rhi is not None and smin > rhi) or (rlo is not None and smax < rlo):
                raise Conflict("linear relation cannot hold")
            for (c, r), mn, mx in zip(terms, mins, maxs, strict=True):
                # c * x lies in [rlo - (smax - mx), rhi - (smin - mn)]
                low = None if rlo is None else rlo - (smax - mx)
                high = None if rhi is None else rhi - (smin - mn)
                if c > 0:
                    new_lo = -((-low) // c) if low is not None else los[r]
                    new_hi = high // c if high is not None else his[r]
                else:
                    new_lo = -((-high) // c) if high is not None else los[r]
                    new_hi = low // c if low is not None else his[r]
                if new_lo > los[r]:
                    los[r], changed = new_lo, True
                if new_hi < his[r]:
                    his[r], changed = new_hi, True
                if los[r] > his[r]:
                    raise Conflict("linear relation cannot hold")
        if not changed:
            return
