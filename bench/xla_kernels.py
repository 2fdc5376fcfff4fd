"""What XLA runs on the GPU for one decode step: kernels in compiled HLO, and in a profiler trace.

Pure parsing, no JAX needed: `decode_step_kernels` counts the kernels of the innermost loop
body of a compiled program's HLO text (any backend); `gpu_kernels_from_trace` reads the GPU
events of a `jax.profiler` trace (`*.trace.json.gz`, Chrome trace format) and `kernel_table`
groups the decode loop's kernels per step. Used by `bench.learner_bench --profile-decode`
and `--hlo-count`.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

# HLO instructions that launch nothing on their own.
_NO_KERNEL = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "opt-barrier",
    "add-dependency",
    "partition-id",
    "replica-id",
}
_HLO_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_HLO_OP = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w\-]*)\((.*)$")
_NUMBERING = re.compile(r"([._]\d+)+$")


def hlo_computations(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """Compiled HLO text -> {computation: [(instruction, opcode, rest of line)]}."""
    comps: dict[str, list[tuple[str, str, str]]] = {}
    current: list[tuple[str, str, str]] | None = None
    for line in text.splitlines():
        header = _HLO_HEADER.match(line)
        if header and not line.startswith(" "):
            current = comps.setdefault(header.group(1), [])
        elif line.startswith("}"):
            current = None
        elif current is not None and (op := _HLO_OP.match(line)):
            current.append((op.group(1), op.group(2), op.group(3)))
    return comps


def _kernel_ops(comps: dict[str, list[tuple[str, str, str]]], name: str) -> list[tuple[str, str]]:
    """(instruction, opcode) of the kernels one run of a computation launches; nested loops and
    calls (command buffers) are entered, fusion bodies are not (a fusion is one kernel)."""
    ops: list[tuple[str, str]] = []
    for inst, opcode, rest in comps.get(name, []):
        if opcode == "while":
            continue  # counted as a loop of its own
        if opcode == "call" and (target := re.search(r"to_apply=%?([\w.\-]+)", rest)):
            ops += _kernel_ops(comps, target.group(1))
        elif opcode not in _NO_KERNEL:
            ops.append((inst, opcode))
    return ops


def decode_step_kernels(text: str, chunk: int) -> dict[str, Any]:
    """Kernels per decode step in the compiled decode program (its innermost loop body).

    The per-token body is the innermost `while`; if XLA unrolled it (a known trip count below
    `chunk`, or no inner loop left), the body holds several steps and the count is divided.
    Also returns the body's instruction names, to pick the loop's kernels out of a trace.
    """
    comps = hlo_computations(text)
    loops = []  # (body, known trip count or None)
    for lines in comps.values():
        for _, opcode, rest in lines:
            if opcode == "while" and (body := re.search(r"body=%?([\w.\-]+)", rest)):
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                loops.append((body.group(1), int(trip.group(1)) if trip else None))
    if not loops:
        return {"error": "no while loop in the compiled program"}
    innermost = [
        (b, n) for b, n in loops if not any(op == "while" for _, op, _ in comps.get(b, []))
    ]
    body, trip = max(innermost or loops, key=lambda bn: len(_kernel_ops(comps, bn[0])))
    ops = _kernel_ops(comps, body)
    steps_in_body = chunk // trip if trip and chunk % trip == 0 else (1 if trip else chunk)
    by_op: dict[str, int] = {}
    for _, opcode in ops:
        by_op[opcode] = by_op.get(opcode, 0) + 1
    loop_ops = sorted({inst for b, _ in loops for inst, _ in _kernel_ops(comps, b)})
    module = re.match(r"HloModule ([\w.\-]+)", text)
    return {
        "kernels_per_step": len(ops) / steps_in_body,
        "by_op_per_step": {k: v / steps_in_body for k, v in sorted(by_op.items())},
        "steps_in_body": steps_in_body,
        "module": module.group(1) if module else None,
        "loop_op_names": loop_ops,
        "all_op_names": sorted({i for lines in comps.values() for i, op, _ in lines}),
    }


def _kernel_symbol(hlo_name: str) -> str:
    """The GPU kernel name XLA gives an HLO instruction ('.' and '-' are not C identifiers)."""
    return hlo_name.replace(".", "_").replace("-", "_")


def gpu_kernels_from_trace(trace_dir: Path) -> list[dict[str, Any]] | None:
    """Kernel (and memcpy) events on the GPU streams of the newest `*.trace.json.gz` under
    `trace_dir`: [{name, hlo_op, dur_us, ts, module}], or None when the trace has no GPU."""
    files = sorted(trace_dir.rglob("*.trace.json.gz"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    with gzip.open(files[-1], "rt") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    gpu_pids, threads = set(), {}
    for e in events:
        if e.get("ph") != "M":
            continue
        label = str(e.get("args", {}).get("name", ""))
        if e.get("name") == "process_name" and label.startswith("/device:GPU"):
            gpu_pids.add(e["pid"])
        elif e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = label
    if not gpu_pids:
        return None
    streams = {k for k, v in threads.items() if k[0] in gpu_pids and v.startswith("Stream")}
    derived = ("XLA", "Framework", "Source", "Steps", "Launch", "TensorFlow")
    keep = streams or {
        k for k, v in threads.items() if k[0] in gpu_pids and not v.startswith(derived)
    }
    return [
        {
            "name": e.get("name", "?"),
            "hlo_op": (e.get("args") or {}).get("hlo_op"),
            "dur_us": float(e.get("dur", 0.0)),
            "ts": float(e.get("ts", 0.0)),
            "module": (e.get("args") or {}).get("hlo_module"),
        }
        for e in events
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in keep
    ]


def kernel_table(
    kernels: list[dict[str, Any]], loop_ops: set[str], all_ops: set[str], steps: int
) -> dict[str, Any]:
    """Per-step kernel rows of one traced decode program, biggest total first.

    A kernel belongs to the decode loop if the HLO instruction that launched it lies in a loop
    body: found by its `hlo_op`, else by its name (XLA names its kernels after the instruction;
    inside a CUDA graph `hlo_op` only names the command buffer). Library kernels (cuBLAS) carry
    neither and go with the XLA kernel before them.
    """
    loop = {_kernel_symbol(op) for op in loop_ops}
    known = {_kernel_symbol(op) for op in all_ops}
    rows: dict[str, dict[str, float]] = {}
    in_loop: list[dict[str, Any]] = []
    inside = False
    for k in sorted(kernels, key=lambda k: k["ts"]):
        op = _kernel_symbol(k["hlo_op"] or "")
        name = _kernel_symbol(k["name"])
        owner = op if op in known else name if name in known else None
        if owner is not None:
            inside = owner in loop
        if not inside:
            continue
        in_loop.append(k)
        if name in known:
            label = _NUMBERING.sub("", name)
        else:
            label = k["name"] if len(k["name"]) <= 70 else k["name"][:67] + "..."
            label += f" [{_NUMBERING.sub('', op)}]" if op in known else ""
        row = rows.setdefault(label, {"count": 0, "us": 0.0})
        row["count"] += 1
        row["us"] += k["dur_us"]
    table = [
        {"kernel": label, "per_step": r["count"] / steps, "us_per_step": r["us"] / steps}
        for label, r in rows.items()
    ]
    table.sort(key=lambda r: -r["us_per_step"])
    span = max((k["ts"] + k["dur_us"] for k in in_loop), default=0.0) - min(
        (k["ts"] for k in in_loop), default=0.0
    )
    return {
        "kernels_per_step": len(in_loop) / steps,
        "kernel_us_per_step": sum(k["dur_us"] for k in in_loop) / steps,
        "gpu_span_us_per_step": span / steps,
        "outside_loop_kernels": len(kernels) - len(in_loop),
        "rows": table,
    }
