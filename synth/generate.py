"""Generate programs: the per-program pipeline, retries, dedup and parallelism.

One program ("slot" `index` of a run) is made deterministically from (seed, index):

1. draw `level` operators uniformly from the allowed list (kept across retries, so the
   operator frequencies of the emitted set are those of the draw; only a list that keeps
   failing is drawn again, see `OPS_PATIENCE`);
2. wire them into a DAG (`synth.dag`), draw a skeleton (`synth.skeleton`) and a
   randomised hint; among a few skeletons prefer one whose hint reaches the FLOPs band;
3. one CP-SAT solve (`synth.solve`); print the program (`synth.program`);
4. validate it (`synth.validate`); on any failure start again from step 2 with the next
   attempt's random stream.

Every random choice comes from `random.Random` streams seeded by strings, CP-SAT runs
single-threaded under a deterministic time limit and torch single-threaded, so a slot's
program does not depend on the machine's load or on which process made it. Slots are
farmed out to worker processes and collected in order; a program whose canonical hash
was already emitted is replaced by the slot's next valid attempt (computed in the
parent), so the output is byte-identical for any worker count.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

from synth.dag import choose_ops
from synth.operators import OPERATOR_NAMES, REGISTRY
from synth.pipeline import build_candidate, validate_candidate
from synth.profiles import Profile, load_profile
from synth.program import ProgramRecord

MAX_ATTEMPTS = 256
"""Wirings tried for one slot before giving up (the profile cannot satisfy the request)."""
REDRAW_OPS_EVERY = 32
"""After this many failed wirings the operator list itself is drawn again."""
OPS_PATIENCE = 5
"""Above level 1, an operator list whose programs failed validation this many times
(e.g. exp2 fed by a division: overflow whatever the shapes) is drawn again. Level 1
never redraws, so its emitted operator frequencies are exactly the uniform draw."""


class Unsatisfiable(Exception):
    """No valid program could be made for a slot: the level/operators do not fit the profile."""


@dataclass(frozen=True)
class GenSpec:
    level: int
    profile: Profile
    ops: tuple[str, ...]
    seed: int


def stream(spec: GenSpec, index: int, *salt: object) -> random.Random:
    """The random stream of one slot (and attempt): independent of everything else."""
    key = ":".join(str(x) for x in ("drtriton-synth", spec.seed, spec.level, index, *salt))
    return random.Random(key)


def generate_one(spec: GenSpec, index: int, exclude: frozenset[str] = frozenset()) -> ProgramRecord:
    """The program of slot `index`: its first valid attempt whose hash is not excluded."""
    ops = choose_ops(spec.level, spec.ops, stream(spec, index, "ops"))
    since_draw = rejected = 0
    for attempt in range(MAX_ATTEMPTS):
        if since_draw >= REDRAW_OPS_EVERY or (spec.level > 1 and rejected >= OPS_PATIENCE):
            ops = choose_ops(spec.level, spec.ops, stream(spec, index, "ops", attempt))
            since_draw = rejected = 0
        since_draw += 1
        rng = stream(spec, index, attempt)
        cand = build_candidate(ops, spec.profile, rng)
        if cand is None or cand.program.hash in exclude:
            continue
        if validate_candidate(cand, spec.profile, rng) is not None:
            rejected += 1
        else:
            return ProgramRecord.of(
                cand.program,
                level=spec.level,
                profile=spec.profile.name,
                seed=spec.seed,
                index=index,
                flops_floor=cand.solution.flops_floor,
            )
    raise Unsatisfiable(
        f"no valid level-{spec.level} program from {len(spec.ops)} operator(s) under profile "
        f"{spec.profile.name!r} after {MAX_ATTEMPTS} attempts (slot {index})"
    )


def _init_worker() -> None:
    """Worker processes: one torch thread each (one process per core)."""
    import torch

    torch.set_num_threads(1)


def _start_method() -> str:
    """Fork (workers inherit torch and the registry), unless a threaded runtime is loaded.

    JAX runs threads; forking a process that holds them can deadlock the child (a library
    that imports both, or a test session). Then workers start from a fork server.
    """
    methods = mp.get_all_start_methods()
    if "fork" in methods and "jax" not in sys.modules:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def resolve_ops(ops: Iterable[str] | None) -> tuple[str, ...]:
    if ops is None:
        return OPERATOR_NAMES
    names = tuple(dict.fromkeys(o.strip() for o in ops if o.strip()))
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise KeyError(f"unknown operator(s): {', '.join(unknown)}")
    if not names:
        raise KeyError("empty operator list")
    return names


def generate_programs(
    level: int,
    count: int,
    seed: int,
    profile: str | Profile = "tiny",
    ops: Iterable[str] | None = None,
    workers: int = 1,
    start: int = 0,
    seen: Iterable[str] = (),
) -> Iterator[ProgramRecord]:
    """Programs for slots start .. count-1, in order, with distinct canonical hashes.

    `seen` holds the full hashes (`Program.hash`) already emitted (resuming a run).
    """
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    if not 1 <= level <= prof.max_level:
        raise ValueError(f"level must be in [1, {prof.max_level}] for profile {prof.name!r}")
    spec = GenSpec(level, prof, resolve_ops(ops), seed)
    emitted = set(seen)
    indices = range(start, count)
    if workers <= 1 or len(indices) <= 1:
        results: Iterator[ProgramRecord] = map(partial(generate_one, spec), indices)
        pool = None
    else:
        method = _start_method()
        pool = mp.get_context(method).Pool(workers, initializer=_init_worker)
        results = pool.imap(partial(generate_one, spec), indices, chunksize=1)
    try:
        for index, record in zip(indices, results, strict=True):
            if record.program.hash in emitted:
                record = generate_one(spec, index, frozenset(emitted))
            emitted.add(record.program.hash)
            yield record
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
