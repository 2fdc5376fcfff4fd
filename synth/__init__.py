"""CSP-DAG: random PyTorch programs over 61 operators, with solved tensor shapes.

A program of difficulty `level` applies `level` operators drawn uniformly; its wiring is a
DAG, its ranks and discrete parameters are drawn by a small rank solver, its dimension
sizes come from one CP-SAT solve under a size profile, and it is executed and checked
before it is kept. Importing `synth` imports nothing heavy.

Public API (import from the modules named):

- `synth.operators.REGISTRY: dict[str, Operator]`, `OPERATOR_NAMES` - the operators, in
  the design's order; one entry each (arity, rank rule, parameter choices, shape rule,
  FLOPs, printing).
- `synth.profiles.PROFILES`, `Profile`, `load_profile(name_or_json_path)` - size bounds
  (`paper`, `tiny`) as data.
- `synth.generate.generate_programs(level, count, seed, profile="tiny", ops=None,
  workers=1, start=0, seen=()) -> Iterator[ProgramRecord]` - deterministic, deduplicated
  programs; `generate_one(GenSpec, index)` for one slot; `Unsatisfiable`.
- `synth.program.Program` - `.source` (the canonical text), `.render(return_all=False)`,
  `.shapes`, `.nodes` (`Op(op, inputs, output, params)`), `.outputs`, `.flops`,
  `.bytes`, `to_dict`/`from_dict`; `ProgramRecord` - one JSONL line (`.program`,
  `to_json`/`from_json`).
- `synth.dag.Dag` (`Dag.single(op)`, `Dag.chain(ops)`, `wire(ops, rng)`) and
  `synth.pipeline.instantiate(dag, profile, rng, fixed_ranks=..., fixed_params=...)`,
  `validate_candidate(...)` - build a program of a chosen structure.
- `synth.validate.execute(program, seed, meta=False)`, `check_values`,
  `check_meta_shapes` - run a program and the keep/reject checks.
- `synth.stats.collect/report/plot` - summaries of a generated file.

Command line: `drtriton synth generate ...` and `drtriton synth stats FILE.jsonl`
(`synth.cli`).
"""
