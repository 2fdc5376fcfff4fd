"""Evaluation of a policy: pass@k, Faster1, speedups and curves on synthetic levels and
KernelBench problems (`drtriton eval`).

| module | job |
|---|---|
| `metrics.py` | the figures, as pure functions of per-problem sample outcomes |
| `suites.py` | the problems: synthetic levels (fixed seed), KernelBench records |
| `store.py` | the run directory: settings, problems, one JSON line per sample, resume |
| `run.py` | sampling (or search) and verification through the sandbox fleet |
| `report.py` | summary.json, report.md, speedup_curve.png; comparing two runs |
| `cli.py` | `drtriton eval`, `drtriton eval compare A B`, `drtriton eval report RUN` |
"""
