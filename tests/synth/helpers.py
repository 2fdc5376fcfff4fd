"""Shared by the synth tests: solve a given DAG with pinned choices, run it."""

from __future__ import annotations

import random
from collections.abc import Mapping

from synth.dag import Dag
from synth.operators import Params
from synth.pipeline import Candidate, instantiate
from synth.profiles import TINY, Profile


def solve_dag(
    dag: Dag,
    seed: int,
    ranks: Mapping[int, int] | None = None,
    params: Mapping[int, Params] | None = None,
    profile: Profile = TINY,
) -> Candidate | None:
    """Instantiate `dag` with some ranks/params pinned (None when infeasible)."""
    return instantiate(dag, profile, random.Random(seed), fixed_ranks=ranks, fixed_params=params)


def torch_shapes(program) -> list[tuple[int, ...]]:
    """Shapes PyTorch gives every tensor of the printed program (real CPU run)."""
    from synth.validate import execute

    inputs, computed = execute(program)
    return [tuple(t.shape) for t in [*inputs, *computed]]
