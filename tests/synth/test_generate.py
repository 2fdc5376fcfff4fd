"""Generated programs: bounds, format, determinism, dedup and uniform operator choice."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from synth.dag import Dag, choose_ops, wire
from synth.generate import GenSpec, generate_one, generate_programs, stream
from synth.operators import OPERATOR_NAMES, numel
from synth.pipeline import instantiate
from synth.profiles import PAPER, TINY, Profile
from synth.program import ProgramRecord
from synth.validate import execute

LINE = re.compile(r"    tensor_(\d+) = (torch|F)\.[a-z_0-9]+\(.*\)(\.values|\.float\(\))?")


def assert_within_profile(rec: ProgramRecord, profile: Profile) -> None:
    program = rec.program
    sizes = [numel(s) for s in program.shapes]
    assert all(1 <= d <= profile.max_dim for s in program.shapes for d in s)
    assert max(sizes) <= profile.max_elements
    assert sum(sizes) <= profile.max_total_elements
    assert rec.bytes == 4 * sum(sizes)
    for t in range(program.n_inputs):
        if program.shapes[t]:
            assert sizes[t] >= profile.min_input_elements
    assert rec.flops == program.flops <= profile.flops_max
    assert rec.flops >= rec.flops_floor
    assert rec.flops_floor <= profile.flops_min
    # the floor is the profile's, or lowered by halving
    assert profile.flops_min % rec.flops_floor == 0


def assert_canonical_format(rec: ProgramRecord) -> None:
    lines = rec.source.splitlines()
    program = rec.program
    n_in = program.n_inputs
    names = ", ".join(f"tensor_{i}" for i in range(n_in))
    assert lines[:4] == ["import torch", "import torch.nn.functional as F", "", "def get_inputs():"]
    for i in range(n_in):
        dims = ", ".join(str(d) for d in program.shapes[i])
        assert lines[4 + i] == f"    tensor_{i} = torch.randn([{dims}], dtype=torch.float32)"
    assert lines[4 + n_in : 7 + n_in] == [
        f"    return [{names}]",
        "",
        f"def fused_operator({names}):",
    ]
    body = lines[7 + n_in : -1]
    assert len(body) == rec.level == len(rec.ops)
    for k, line in enumerate(body):
        m = LINE.fullmatch(line)
        assert m, line
        assert int(m.group(1)) == n_in + k  # computed tensors numbered in program order
    outs = ", ".join(f"tensor_{t}" for t in program.outputs)
    assert lines[-1] == f"    return [{outs}]"
    assert rec.source.endswith("\n") and not rec.source.endswith("\n\n")


@settings(max_examples=12, deadline=None)
@given(level=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_tiny_programs_respect_profile_format_and_torch(level: int, seed: int) -> None:
    rec = generate_one(GenSpec(level, TINY, OPERATOR_NAMES, seed), 0)
    assert rec.level == level and len(rec.ops) == level and rec.profile == "tiny"
    assert_within_profile(rec, TINY)
    assert_canonical_format(rec)
    inputs, computed = execute(rec.program, seed)
    assert [list(x.shape) for x in inputs] == rec.input_shapes
    outputs = [
        computed[k] for k, n in enumerate(rec.program.nodes) if n.output in rec.program.outputs
    ]
    assert [list(y.shape) for y in outputs] == rec.output_shapes
    assert ProgramRecord.from_json(rec.to_json()) == rec


@pytest.mark.parametrize("level", [1, 2, 5])
def test_paper_programs_respect_profile(level: int) -> None:
    """Full-size shapes agree on the meta device; most programs reach the FLOPs band."""
    spec = GenSpec(level, PAPER, OPERATOR_NAMES, 11)
    records = [generate_one(spec, i) for i in range(3)]
    for rec in records:
        assert_within_profile(rec, PAPER)
        assert_canonical_format(rec)
        inputs, computed = execute(rec.program, meta=True)
        assert tuple(tuple(t.shape) for t in [*inputs, *computed]) == rec.program.shapes


def test_paper_band_reached_when_a_contraction_allows_it() -> None:
    for seed in range(3):
        rec = generate_one(GenSpec(1, PAPER, ("matmul", "conv2d", "bmm"), seed), 0)
        assert PAPER.flops_min <= rec.flops <= PAPER.flops_max
        assert rec.flops_floor == PAPER.flops_min


def test_a_memory_bound_program_gets_a_halved_floor() -> None:
    rec = generate_one(GenSpec(1, PAPER, ("relu",), 3), 0)
    assert rec.flops <= PAPER.max_elements < PAPER.flops_min
    assert rec.flops_floor < PAPER.flops_min and rec.flops >= rec.flops_floor


def test_level_twenty() -> None:
    rec = generate_one(GenSpec(20, TINY, OPERATOR_NAMES, 5), 0)
    assert len(rec.ops) == 20
    assert_within_profile(rec, TINY)
    assert_canonical_format(rec)


def test_same_dag_different_seeds_give_different_shapes() -> None:
    dag = Dag.chain(["matmul", "relu", "sum"])
    shapes = {instantiate(dag, TINY, random.Random(seed)).program.shapes for seed in range(6)}
    assert len(shapes) >= 4


def test_operator_choice_is_uniform() -> None:
    """Chi-square over 6,100 level-1 draws of the sampler (61 operators, 100 expected each)."""
    spec = GenSpec(1, TINY, OPERATOR_NAMES, 0)
    counts = Counter(choose_ops(1, OPERATOR_NAMES, stream(spec, i, "ops"))[0] for i in range(6100))
    assert set(counts) == set(OPERATOR_NAMES)
    assert chisquare([counts[n] for n in OPERATOR_NAMES]).pvalue > 1e-3


def test_emitted_level1_operators_are_the_drawn_ones() -> None:
    """Retries keep the slot's operator, so emitted frequencies equal the uniform draw."""
    spec = GenSpec(1, TINY, OPERATOR_NAMES, 3)
    for i, rec in enumerate(generate_programs(1, 40, 3, TINY)):
        assert rec.ops == choose_ops(1, OPERATOR_NAMES, stream(spec, i, "ops"))


@pytest.mark.slow
def test_emitted_level1_set_is_uniform() -> None:
    counts = Counter(rec.ops[0] for rec in generate_programs(1, 6100, 0, TINY, workers=2))
    assert chisquare([counts[n] for n in OPERATOR_NAMES]).pvalue > 1e-3


def test_wiring_covers_fan_out_and_multiple_outputs() -> None:
    rng = random.Random(0)
    fan_out = multi_out = 0
    for _ in range(300):
        dag, _ = wire(choose_ops(6, OPERATOR_NAMES, rng), rng)
        uses = Counter(t for n in dag.nodes for t in n.inputs)
        fan_out += max(uses.values()) > 1
        multi_out += len(dag.outputs) > 1
    assert fan_out > 10 and multi_out > 10


def test_determinism_across_worker_counts() -> None:
    one = [r.to_json() for r in generate_programs(3, 6, 42, "tiny", workers=1)]
    two = [r.to_json() for r in generate_programs(3, 6, 42, "tiny", workers=2)]
    assert one == two
    assert [r.to_json() for r in generate_programs(3, 6, 43, "tiny")] != one


def test_resume_continues_identically() -> None:
    full = [r.to_json() for r in generate_programs(2, 5, 9, "tiny")]
    head = [r.to_json() for r in generate_programs(2, 2, 9, "tiny")]
    seen = [ProgramRecord.from_json(j).program.hash for j in head]
    tail = [r.to_json() for r in generate_programs(2, 5, 9, "tiny", start=2, seen=seen)]
    assert head + tail == full


def test_duplicates_are_replaced() -> None:
    """In a small space level-1 programs of one operator collide; every emitted id stays
    unique, and a slot whose first program was already emitted gets its next valid one."""
    micro = TINY.__class__(**{**TINY.__dict__, "name": "micro", "max_dim": 4, "flops_min": 1})
    records = list(generate_programs(1, 6, 0, micro, ops=["relu"]))
    assert len({r.id for r in records}) == 6
    firsts = [generate_one(GenSpec(1, micro, ("relu",), 0), i) for i in range(6)]
    assert len({r.id for r in firsts}) < 6  # collisions happened ...
    replaced = [i for i in range(6) if firsts[i].id != records[i].id]
    assert replaced  # ... and were resolved
    for i in replaced:
        assert firsts[i].id in {r.id for r in records[:i]}
