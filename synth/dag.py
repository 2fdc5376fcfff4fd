"""Operator DAGs: which operators, in which order, reading which tensors.

Difficulty is the number of compute operators (`level`). Operators are drawn uniformly
(from all of them or from a fixed list). Tensors are wired as in the design: a pool holds
the tensors nobody has consumed yet; each operator takes its inputs from the pool and
pushes its output, and a fresh `randn` input is created whenever the pool has no
suitable tensor. Two small deviations widen coverage beyond straight chains: with
`reuse_prob` a slot reads an already-consumed tensor (fan-out, e.g. residuals), and with
`fresh_prob` it takes a fresh input even though the pool could serve (more inputs, more
outputs). Wiring is rank-aware (see `synth.ranks`): a tensor is only drawn for a slot
whose operator can still accept it, so operator choice stays uniform without the DAG
turning infeasible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from synth.operators import REGISTRY
from synth.ranks import RankCSP, slot_masks

REUSE_PROB = 0.05
FRESH_PROB = 0.1


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    output: int


@dataclass(frozen=True)
class Dag:
    """Tensors are numbered in creation order (fresh inputs interleaved with outputs)."""

    n_tensors: int
    inputs: tuple[int, ...]
    nodes: tuple[Node, ...]

    @property
    def outputs(self) -> tuple[int, ...]:
        """Tensors no operator consumes, in creation order."""
        consumed = {t for n in self.nodes for t in n.inputs}
        produced = [n.output for n in self.nodes]
        return tuple(t for t in sorted(produced) if t not in consumed)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    @staticmethod
    def single(op_name: str) -> Dag:
        """One operator on fresh inputs (a level-1 program)."""
        arity = REGISTRY[op_name].arity
        return Dag(arity + 1, tuple(range(arity)), (Node(op_name, tuple(range(arity)), arity),))

    @staticmethod
    def chain(op_names: Sequence[str]) -> Dag:
        """Each operator reads the previous output first; other slots read fresh inputs."""
        inputs: list[int] = []
        nodes: list[Node] = []
        n = 0
        prev: int | None = None
        for name in op_names:
            ins = []
            for slot in range(REGISTRY[name].arity):
                if slot == 0 and prev is not None:
                    ins.append(prev)
                else:
                    inputs.append(n)
                    ins.append(n)
                    n += 1
            nodes.append(Node(name, tuple(ins), n))
            prev = n
            n += 1
        return Dag(n, tuple(inputs), tuple(nodes))

    def rank_csp(self) -> RankCSP:
        csp = RankCSP()
        for _ in range(self.n_tensors):
            csp.new_tensor()
        for n in self.nodes:
            if not csp.add(n.op, (*n.inputs, n.output)):
                raise ValueError("DAG has no rank assignment")
        return csp


def choose_ops(level: int, allowed: Sequence[str], rng: random.Random) -> list[str]:
    """`level` operators drawn uniformly (with replacement) from `allowed`."""
    return [rng.choice(allowed) for _ in range(level)]


def wire(
    ops: Sequence[str],
    rng: random.Random,
    reuse_prob: float = REUSE_PROB,
    fresh_prob: float = FRESH_PROB,
) -> tuple[Dag, RankCSP]:
    """Wire the operators into a DAG whose ranks are satisfiable."""
    csp = RankCSP()
    inputs: list[int] = []
    nodes: list[Node] = []
    pool: list[int] = []
    consumed: list[int] = []
    for op_name in ops:
        arity = REGISTRY[op_name].arity
        masks = slot_masks(op_name)
        weights = REGISTRY[op_name].weight_slots
        for attempt in range(4):
            all_fresh = attempt == 3
            chosen: list[int] = []
            fresh: list[int] = []
            for j in range(arity):
                mask = masks[j]
                u = rng.random()
                source: list[int] = []
                if not all_fresh and u >= fresh_prob and j not in weights:
                    source = consumed if u < fresh_prob + reuse_prob else pool
                    source = [t for t in source if t not in chosen and csp.doms[t] & mask]
                    if not source and u < fresh_prob + reuse_prob:
                        source = [t for t in pool if t not in chosen and csp.doms[t] & mask]
                if source:
                    chosen.append(rng.choice(source))
                else:
                    t = csp.new_tensor(mask)
                    fresh.append(t)
                    chosen.append(t)
            out = csp.new_tensor()
            if csp.add(op_name, (*chosen, out)):
                break
            # undo the tensors this attempt created (they are the last ones)
            del csp.doms[-(len(fresh) + 1) :]
            del csp.watch[-(len(fresh) + 1) :]
        else:  # pragma: no cover - an operator alone on fresh inputs is always satisfiable
            raise AssertionError(f"cannot place {op_name}")
        inputs.extend(fresh)
        nodes.append(Node(op_name, tuple(chosen), out))
        for t in chosen:
            if t in pool:
                pool.remove(t)
            if t not in consumed:
                consumed.append(t)
        pool.append(out)
    return Dag(len(csp.doms), tuple(inputs), tuple(nodes)), csp
