"""A program's discrete skeleton: ranks, every operator parameter, and its dim system.

Given a wired DAG, this draws everything except the sizes of dimensions: the rank of
every tensor (`synth.ranks`), the parameters of every operator (axis, keepdim, kernel,
stride, padding, dilation, groups, broadcast pattern, ...), and then lets each operator
state its shape rule on symbolic dims. What remains is a small integer problem over
classes of equal dims (`synth.dims.DimProblem`) plus, per tensor, which classes make up
its shape and, per operator, which classes multiply into its FLOPs: exactly what the
CP-SAT model (`synth.solve`) needs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter

from synth.dag import Dag
from synth.dims import Conflict, DimProblem, DimSystem
from synth.operators import REGISTRY, ParamContext, Params
from synth.profiles import Profile
from synth.ranks import RankCSP

PARAM_ATTEMPTS = 8
"""Draws of one operator's parameters before the skeleton is given up."""


@dataclass(frozen=True)
class Skeleton:
    dag: Dag
    ranks: tuple[int, ...]
    """Per tensor."""
    params: tuple[Params, ...]
    """Per node."""
    problem: DimProblem
    tensor_dims: tuple[tuple[int, ...], ...]
    """Per tensor: the root (class) index of each of its dims."""
    flop_terms: tuple[tuple[int, tuple[int, ...]], ...]
    """Per node: FLOPs = coef * prod(values of these roots)."""

    @cached_property
    def _getters(self) -> tuple[list[Callable], list[tuple[int, Callable]]]:
        # Root 0 is the constant-1 class; padding with it makes every getter return a tuple.
        tensors = [itemgetter(0, 0, *dims) for dims in self.tensor_dims]
        terms = [(coef, itemgetter(0, 0, *roots)) for coef, roots in self.flop_terms]
        return tensors, terms

    def evaluate(self, values: Sequence[int]) -> tuple[list[int], int, int]:
        """(element count per tensor, total elements, total FLOPs) of an assignment of
        values to roots. Called thousands of times per program, hence the item getters."""
        tensors, terms = self._getters
        prod = math.prod
        sizes = [prod(get(values)) for get in tensors]
        flops = sum(coef * prod(get(values)) for coef, get in terms)
        return sizes, sum(sizes), flops


def sample_skeleton(
    dag: Dag,
    csp: RankCSP,
    profile: Profile,
    rng: random.Random,
    *,
    fixed_ranks: Mapping[int, int] | None = None,
    fixed_params: Mapping[int, Params] | None = None,
) -> Skeleton:
    """Draw ranks and parameters and build the dim system.

    `fixed_ranks` (tensor -> rank) and `fixed_params` (node -> params, merged over the
    drawn ones) pin choices, which tests use to exercise a given shape rule. Raises
    `Conflict` when the drawn choices contradict each other; the caller draws again.
    """
    if fixed_ranks:
        saved = list(csp.doms)
        for t, r in fixed_ranks.items():
            csp.doms[t] &= 1 << r
        ok = all(csp.doms) and csp.propagate(list(range(len(csp.constraints))))
        solved = csp.solve(rng) if ok else None
        csp.doms[:] = saved
    else:
        solved = csp.solve(rng)
    if solved is None:
        raise Conflict("no rank assignment")
    ranks, rank_params = solved

    m = DimSystem()
    dims: list[list[int]] = [[] for _ in range(dag.n_tensors)]
    for t in dag.inputs:
        dims[t] = [m.new() for _ in range(ranks[t])]
    params: list[Params] = []
    terms_atoms = []
    for i, node in enumerate(dag.nodes):
        op = REGISTRY[node.op]
        in_ranks = tuple(ranks[t] for t in node.inputs)
        ins = [dims[t] for t in node.inputs]
        fixed = tuple(tuple(m.fixed(a) for a in d) for d in ins)
        state = m.snapshot()
        for attempt in range(PARAM_ATTEMPTS):
            ctx = ParamContext(
                rng, in_ranks, ranks[node.output], rank_params[i], profile, fixed, attempt
            )
            p = {**rank_params[i], **op.sample_params(ctx)}
            if fixed_params and i in fixed_params:
                p.update(fixed_params[i])
            try:
                out = op.shape(m, ins, p)
                if len(m.relations) and not m.feasible(profile.max_dim):
                    raise Conflict("linear relations cannot hold")
                break
            except Conflict:
                m.restore(state)
                if attempt == PARAM_ATTEMPTS - 1:
                    raise
        params.append(p)
        if len(out) != ranks[node.output]:
            raise AssertionError(
                f"{node.op}: shape rule gave rank {len(out)}, table says {ranks[node.output]}"
            )
        dims[node.output] = out
        terms_atoms.append(op.flops(ins, out, p))
    problem = m.freeze()
    root = problem.atom_root
    tensor_dims = tuple(tuple(root[a] for a in d) for d in dims)
    flop_terms = tuple((coef, tuple(root[a] for a in atoms)) for coef, atoms in terms_atoms)
    return Skeleton(dag, tuple(ranks), tuple(params), problem, tensor_dims, flop_terms)
