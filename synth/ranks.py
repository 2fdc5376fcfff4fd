"""Tensor ranks as a small finite-domain CSP, solved in Python before any dims.

Ranks live in [0, MAX_RANK] and every operator relates the ranks of its inputs and
output through a short table (`Operator.rank_table`). Domains are bitmasks; each
operator is a table constraint kept generalised-arc-consistent (GAC) as the DAG grows,
so the DAG sampler only wires a tensor into an operator that can still accept it, and
the final assignment (one table row per operator, drawn at random) rarely backtracks.
Solving ranks here keeps the CP-SAT model free of rank-dependent (reified) constraints.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

from synth.operators import REGISTRY, Params
from synth.profiles import MAX_RANK

FULL = (1 << (MAX_RANK + 1)) - 1
"""Domain bitmask allowing every rank."""


@cache
def slot_masks(op_name: str) -> tuple[int, ...]:
    """Per position (inputs..., output): the ranks some table row allows there."""
    rows = REGISTRY[op_name].rank_table
    width = REGISTRY[op_name].arity + 1
    masks = [0] * width
    for ranks, _ in rows:
        for i, r in enumerate(ranks):
            masks[i] |= 1 << r
    return tuple(masks)


@lru_cache(maxsize=1 << 16)
def supported(op_name: str, doms: tuple[int, ...]) -> tuple[int, ...]:
    """Indices of the table rows compatible with the given domains."""
    rows = REGISTRY[op_name].rank_table
    return tuple(
        i
        for i, (ranks, _) in enumerate(rows)
        if all((d >> r) & 1 for d, r in zip(doms, ranks, strict=True))
    )


@lru_cache(maxsize=1 << 16)
def revise(op_name: str, doms: tuple[int, ...]) -> tuple[int, ...] | None:
    """The domains narrowed to the supported rows, or None when none is left."""
    rows = REGISTRY[op_name].rank_table
    out = [0] * len(doms)
    found = False
    for i in supported(op_name, doms):
        found = True
        for j, r in enumerate(rows[i][0]):
            out[j] |= 1 << r
    return tuple(out) if found else None


@dataclass
class RankCSP:
    """Rank domains of the tensors of a DAG and the operator constraints between them."""

    doms: list[int] = field(default_factory=list)
    constraints: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    """(operator, (inputs..., output)) in program order."""
    watch: list[list[int]] = field(default_factory=list)
    """Tensor -> indices of the constraints that mention it."""

    def new_tensor(self, mask: int = FULL) -> int:
        self.doms.append(mask)
        self.watch.append([])
        return len(self.doms) - 1

    def add(self, op_name: str, tensors: Sequence[int]) -> bool:
        """Add a constraint and propagate; on failure leave everything as it was."""
        saved = list(self.doms)
        idx = len(self.constraints)
        self.constraints.append((op_name, tuple(tensors)))
        for t in set(tensors):
            self.watch[t].append(idx)
        if self.propagate([idx]):
            return True
        self.doms[:] = saved
        self.constraints.pop()
        for t in set(tensors):
            self.watch[t].pop()
        return False

    def propagate(self, queue: list[int]) -> bool:
        """GAC to a fixpoint starting from the given constraints; False on a wipe-out."""
        doms, pending = self.doms, set(queue)
        queue = list(queue)
        while queue:
            c = queue.pop()
            pending.discard(c)
            op_name, tensors = self.constraints[c]
            before = tuple(doms[t] for t in tensors)
            after = revise(op_name, before)
            if after is None:
                return False
            for t, b, a in zip(tensors, before, after, strict=True):
                if a != b:
                    doms[t] &= a
                    for other in self.watch[t]:
                        if other != c and other not in pending:
                            pending.add(other)
                            queue.append(other)
        return True

    def solve(
        self, rng: random.Random, max_backtracks: int = 200
    ) -> tuple[list[int], list[Params]] | None:
        """Draw one row per constraint (uniformly among those still possible), in program
        order, with propagation after each choice. Returns (ranks, rank params per
        constraint) or None if the budget of backtracks runs out."""
        rows_of = [REGISTRY[op].rank_table for op, _ in self.constraints]
        chosen: list[int] = []
        stack: list[tuple[list[int], list[int]]] = []  # (saved doms, remaining candidates)
        backtracks = 0
        saved_root = list(self.doms)
        try:
            while len(chosen) < len(self.constraints):
                c = len(chosen)
                if len(stack) == c:
                    op_name, tensors = self.constraints[c]
                    cands = list(supported(op_name, tuple(self.doms[t] for t in tensors)))
                    rng.shuffle(cands)
                    stack.append((list(self.doms), cands))
                saved, cands = stack[-1]
                placed = False
                while cands:
                    row = cands.pop()
                    self.doms[:] = saved
                    _, tensors = self.constraints[c]
                    for t, r in zip(tensors, rows_of[c][row][0], strict=True):
                        self.doms[t] &= 1 << r
                    if all(self.doms[t] for t in tensors) and self.propagate(
                        [i for t in set(tensors) for i in self.watch[t]]
                    ):
                        chosen.append(row)
                        placed = True
                        break
                if not placed:
                    backtracks += 1
                    if backtracks > max_backtracks or len(stack) == 1:
                        return None
                    stack.pop()
                    chosen.pop()
            ranks = [d.bit_length() - 1 for d in self.doms]
            rparams = [dict(rows_of[c][row][1]) for c, row in enumerate(chosen)]
            return ranks, rparams
        finally:
            self.doms[:] = saved_root
