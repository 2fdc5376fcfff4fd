"""The learner bench's decode diagnostics: HLO kernel counts and the GPU trace parser (CPU)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jax
import jax.numpy as jnp

from bench import xla_kernels


def test_decode_step_kernels_finds_the_loop_body() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c @ c) + i, x)

    text = jax.jit(f).lower(jnp.ones((8, 8))).compile().as_text()
    counts = xla_kernels.decode_step_kernels(text, chunk=1)
    assert counts["kernels_per_step"] >= 1
    assert set(counts["loop_op_names"]) <= set(counts["all_op_names"])
    assert counts["module"] and counts["module"].startswith("jit_f")


def _write_trace(root: Path, events: list[dict]) -> None:
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 7, "tid": 3, "name": "thread_name", "args": {"name": "Stream #3"}},
        {"ph": "M", "pid": 7, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
    ]
    folder = root / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "host.trace.json.gz", "wt") as handle:
        json.dump({"displayTimeUnit": "ns", "traceEvents": meta + events}, handle)


def test_kernel_table_attributes_graph_and_library_kernels(tmp_path: Path) -> None:
    """Kernels inside a CUDA graph name only the command buffer: match them by kernel name;
    a cuBLAS kernel goes with the XLA kernel before it; derived lines are not kernels."""

    def kernel(name: str, ts: float, op: str = "command_buffer_0", tid: int = 3) -> dict:
        args = {"hlo_op": op, "hlo_module": "jit__decode"}
        return {"ph": "X", "pid": 7, "tid": tid, "name": name, "ts": ts, "dur": 2.0, "args": args}

    events = [kernel("concatenate_fusion_3", 0.0, op="concatenate_fusion.3")]  # once, before
    for step in range(2):
        t = 10.0 + 10 * step
        events += [
            kernel("loop_add_fusion_1", t),
            kernel("sm90_xmma_gemm_bf16", t + 3),
            kernel("input_reduce_fusion_12", t + 6),
        ]
    events.append(kernel("loop_add_fusion_1", 11.0, op="loop_add_fusion.1", tid=9))
    _write_trace(tmp_path, events)
    kernels = xla_kernels.gpu_kernels_from_trace(tmp_path)
    assert kernels is not None and len(kernels) == 7
    loop = {"loop_add_fusion.1", "input_reduce_fusion.12"}
    table = xla_kernels.kernel_table(kernels, loop, loop | {"concatenate_fusion.3"}, steps=2)
    assert table["kernels_per_step"] == 3 and table["outside_loop_kernels"] == 1
    rows = {r["kernel"]: r["per_step"] for r in table["rows"]}
    assert rows == {"loop_add_fusion": 1, "sm90_xmma_gemm_bf16": 1, "input_reduce_fusion": 1}
    assert table["kernel_us_per_step"] == 6.0


def test_trace_without_a_gpu_gives_none(tmp_path: Path) -> None:
    _write_trace(tmp_path, [])
    (tmp_path / "plugins/profile/run/host.trace.json.gz").unlink()
    folder = tmp_path / "plugins" / "profile" / "cpu"
    folder.mkdir()
    with gzip.open(folder / "vm.trace.json.gz", "wt") as handle:
        json.dump({"traceEvents": [{"ph": "M", "pid": 1, "name": "process_name"}]}, handle)
    assert xla_kernels.gpu_kernels_from_trace(tmp_path) is None
