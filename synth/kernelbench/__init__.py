"""KernelBench-format problems (`class Model`, `get_inputs()`, `get_init_inputs()`)
rewritten into the functional format (DESIGN §2) through `torch.export`.

- `load.py`: find and import problem files (a fixed seed for the Model's weights).
- `graph.py`: export a Model and run its ATen graph once on example values.
- `lower.py`: walk the graph and write one program line per operator; `registry.py`
  maps an ATen call onto an operator of `synth.operators`, `fragments.py` prints any
  other call as plain PyTorch; `program.py` assembles the source.
- `check.py`: the rewritten program against the Model on fresh inputs.
- `export.py`: `export_problem(path) -> ExportResult`, the whole path with its reasons.
- `cli.py`: `drtriton synth kernelbench DIR_OR_FILES --out problems.jsonl`.

Nothing here is imported by `synth` itself; torch loads when a function runs.
"""
