"""GPU time of each Pallas decode kernel under each of its settings, from one profiler trace.

    python -m bench.decode_kernel_sweep --model 0.5b --out runs/decode_sweep.md   # a GPU host
    python -m bench.decode_kernel_sweep --lower-only                               # anywhere

At batch 1 a decode step is a chain of small kernels (`learner.generate.decode_kernels`), each a few
microseconds, and timing them from the host (a loop of layers, a call per step) drowns the
differences between settings in dispatch noise (+/-15% per layer). Here every setting of
every kernel gets its own kernel name, all of them run in one `jax.profiler` trace, and each
setting's time is the median duration of its kernels on the GPU: device time, without host
noise. One call of a setting runs the kernel over `--layers` distinct weight sets (the
weights of a real model do not sit in L2 between layers).

The table gives, per kernel, the default setting first, then each other setting, with its
microseconds per call, the bytes it must read over the copy bandwidth (`--bandwidth`), and
how it compares with the default. Launch gaps are not in these times: a split attention
(two kernels) pays one more gap than an unsplit one. `--lower-only` lowers every setting to
Triton for a CUDA GPU from shapes alone (no GPU needed): a check of the grid itself.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# name: (hidden, intermediate, heads, kv_heads, head_dim) of the Qwen2.5 shapes
MODELS = {
    "0.5b": (896, 4864, 14, 2, 64),
    "1.5b": (1536, 8960, 12, 2, 128),
    "7b": (3584, 18944, 28, 4, 128),
}


def _grid(**axes: tuple[Any, ...]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


# The settings tried per kernel (the default, {}, always first). Kernel options as data.
GRID: dict[str, list[dict[str, Any]]] = {
    "qkv": _grid(block_j=(2, 4, 8, 16, 32), num_warps=(1, 2, 4, 8))
    + _grid(pieces=(True,), block_j=(2, 4, 8), num_warps=(1, 2, 4)),
    "attention": _grid(splits=(1, 4, 8, 12, 16, 24, 32, 48), block_s=(32, 64, 128), num_warps=(4,))
    # many short chunks: more loads in flight at once, on fewer warps each
    + _grid(splits=(48, 96), block_s=(16, 32), num_warps=(1, 2, 4)),
    "o_proj": _grid(block_n=(1, 2, 4, 8, 16), num_warps=(2, 4, 8))
    + _grid(splits=(2, 4), block_n=(8, 16, 32), num_warps=(4,))
    + _grid(pieces=(True,), block_n=(2, 4, 8), num_warps=(2, 4)),
    "gate_up": _grid(block_n=(1, 2, 4, 8, 16), num_warps=(1, 2, 4, 8), num_stages=(1, 2))
    # whole rows in exact power-of-two spans (no masked registers past 896)
    + _grid(pieces=(True,), block_n=(1, 2, 4), num_warps=(1, 2, 4)),
    "down": _grid(
        block_n=(2, 4, 8), block_k=(1024, 2048, 8192), num_warps=(4, 8), num_stages=(1, 3)
    )
    + _grid(splits=(2, 4, 8), block_n=(8, 16, 32), block_k=(256, 512), num_warps=(4, 8))
    + _grid(pieces=(True,), block_n=(1, 2, 4), num_warps=(2, 4, 8))
    # the chunked default of two rows a program (one row wider than the tile budget)
    + _grid(pieces=(False,), block_n=(2,), num_warps=(4,)),
}


@dataclass
class Setting:
    kernel: str
    options: dict[str, Any]
    index: int

    @property
    def name(self) -> str:
        return f"sweep_{self.kernel}_{self.index}"

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options.items()) or "default"


def settings(
    kernels: list[str], defaults_only: frozenset[str] = frozenset(), match: str = ""
) -> list[Setting]:
    """Each kernel's default, then those of its GRID settings whose label contains `match`."""
    out = []
    for kernel in kernels:
        grid = [] if kernel in defaults_only else GRID[kernel]
        for index, options in enumerate([{}, *grid]):
            setting = Setting(kernel, options, index)
            if index == 0 or match in setting.label:
                out.append(setting)
    return out


def read_bytes(kernel: str, shape: tuple[int, ...], rows: int, length: int) -> int:
    """Bytes one call must read at least (bf16 weights and cache), for the bandwidth column."""
    hidden, inter, heads, kv, head_dim = shape
    weights = {
        "qkv": (heads + 2 * kv) * head_dim * hidden,
        "attention": 2 * kv * length * head_dim * rows,
        "o_proj": hidden * heads * head_dim,
        "gate_up": 2 * inter * hidden,
        "down": hidden * inter,
    }
    return 2 * weights[kernel]


_ARGUMENTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def arguments(
    kernel: str,
    shape: tuple[int, ...],
    rows: int,
    length: int,
    layers: int,
    lower: bool,
    index: int | None = None,
) -> tuple[Any, ...]:
    """The arguments of a kernel's calls, made once and shared by all its settings (abstract
    shapes when `lower`, random bf16 arrays otherwise). `index`: the new token's cache slot
    (attention reads the slots up to it), by default two thirds of the way."""
    if index is None:
        index = 2 * length // 3
    key = (kernel, shape, rows, length, layers, lower, index)
    if key in _ARGUMENTS:
        return _ARGUMENTS[key]
    _ARGUMENTS.clear()  # one kernel's arrays at a time: 7B weights take GiBs
    import jax
    import jax.numpy as jnp

    hidden, inter, heads, kv, head_dim = shape
    group = heads // kv
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 * layers + 8))

    def arr(shape: tuple[int, ...], dtype: Any = jnp.bfloat16, scale: float = 0.02) -> Any:
        if lower:
            return jax.ShapeDtypeStruct(shape, dtype)
        if dtype == jnp.int32:
            return jnp.ones(shape, dtype)
        return (jax.random.normal(next(keys), shape, jnp.float32) * scale).astype(dtype)

    def per_layer(shape: tuple[int, ...], scale: float = 0.02) -> list[Any]:
        return [arr(shape, scale=scale) for _ in range(layers)]

    x = arr((rows, hidden), scale=1.0)
    if kernel == "qkv":
        half = head_dim // 2
        args: tuple[Any, ...] = (
            x,
            per_layer((kv, group + 2, head_dim, hidden)),
            per_layer((kv, group + 2, head_dim)),
            arr((rows,), jnp.int32),  # positions
            arr((half,), jnp.float32),  # inverse frequencies
        )
    elif kernel == "attention":
        args = (
            arr((rows, kv, group + 2, head_dim), scale=1.0),
            arr((rows, length), jnp.int32),
            jax.ShapeDtypeStruct((1,), jnp.int32) if lower else jnp.full((1,), index, jnp.int32),
            per_layer((rows, kv, length, head_dim), 1.0),
            per_layer((rows, kv, length, head_dim), 1.0),
        )
    elif kernel in ("o_proj", "down"):
        k = heads * head_dim if kernel == "o_proj" else inter
        args = (arr((rows, k), scale=1.0), per_layer((hidden, k)), x)
    elif kernel == "gate_up":
        args = (x, per_layer((2, inter, hidden)))
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    _ARGUMENTS[key] = args
    return args


def build(setting: Setting, lower: bool) -> Callable[..., Any]:
    """A jitted call of one setting over every weight set of `arguments`."""
    import jax

    from learner.generate import decode_kernels as dk

    options = {**setting.options, "name": setting.name, "interpret": False if lower else None}
    kernel = setting.kernel
    if kernel == "qkv":

        def run(x, ws, bs, positions, inv_freq):
            return [
                dk.qkv_rope(x, w, b, positions, inv_freq, eps=1e-6, **options)
                for w, b in zip(ws, bs, strict=True)
            ]

    elif kernel == "attention":

        def run(qkv, mask, index, ks, vs):
            return [
                dk.attention(qkv, mask, k, v, index, **options)[0]
                for k, v in zip(ks, vs, strict=True)
            ]

    elif kernel in ("o_proj", "down"):

        def run(x, ws, residual):
            for w in ws:
                residual = dk.matvec_residual(x, w, residual, **options)
            return residual

    elif kernel == "gate_up":

        def run(x, ws):
            return [dk.gate_up_silu(x, w, eps=1e-6, **options) for w in ws]

    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    return jax.jit(run)


def lower_all(args: argparse.Namespace, todo: list[Setting], shape: tuple[int, ...]) -> int:
    failures = 0
    for setting in todo:
        fn = build(setting, lower=True)
        fn_args = arguments(setting.kernel, shape, args.rows, args.length, 1, lower=True)
        try:
            text = fn.trace(*fn_args).lower(lowering_platforms=("cuda",)).as_text()
            ok = "__gpu$xla.gpu.triton" in text
            print(f"{setting.kernel:9s} {setting.label:55s} {'lowered' if ok else 'NO KERNEL'}")
            failures += not ok
        except Exception as err:  # noqa: BLE001 - reported per setting, counted
            print(f"{setting.kernel:9s} {setting.label:55s} error: {str(err)[:120]}")
            failures += 1
    print(f"{len(todo) - failures} of {len(todo)} settings lower to Triton for a CUDA GPU")
    return 1 if failures else 0


def kernel_times(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Durations (us) per setting name; a split attention's combine adds to its call."""
    times: dict[str, list[float]] = {}
    for event in events:
        match = re.match(r"(sweep_[a-z_]+?_\d+)(_combine)?(__\d+)?$", event["name"])
        if match:
            times.setdefault(match.group(1) + (match.group(2) or ""), []).append(event["dur_us"])
    return times


def measure(args: argparse.Namespace, todo: list[Setting], shape: tuple[int, ...]) -> list[dict]:
    import jax

    from bench.xla_kernels import gpu_kernels_from_trace

    if jax.default_backend() != "gpu":
        raise SystemExit("drtriton: error: timing needs a GPU (--lower-only runs anywhere)")
    events: list[dict[str, Any]] = []
    compiled: list[Setting] = []
    # One trace per kernel: its settings share one set of arrays (7B weights take GiBs).
    for kernel in dict.fromkeys(s.kernel for s in todo):
        fn_args = arguments(
            kernel, shape, args.rows, args.length, args.layers, lower=False, index=args.index
        )
        ready = []
        for setting in (s for s in todo if s.kernel == kernel):
            fn = build(setting, lower=False)
            try:
                jax.block_until_ready(fn(*fn_args))  # compile and warm up, outside the trace
                ready.append(fn)
                compiled.append(setting)
            except Exception as err:  # noqa: BLE001 - reported in the table
                print(f"{setting.name} ({setting.label}): {str(err)[:200]}", file=sys.stderr)
        trace_dir = Path(tempfile.mkdtemp(prefix=f"decode-sweep-{kernel}-"))
        with jax.profiler.trace(str(trace_dir)):
            for _ in range(args.repeats):
                for fn in ready:
                    jax.block_until_ready(fn(*fn_args))
        found = gpu_kernels_from_trace(trace_dir)
        if found is None:
            raise SystemExit("drtriton: error: the trace has no GPU kernels (is this a GPU host?)")
        events += found
    times = kernel_times(events)
    rows = []
    for setting in compiled:
        main = times.get(setting.name, [])
        combine = times.get(setting.name + "_combine", [])
        parts = [statistics.median(t) for t in (main, combine) if t]
        rows.append(
            {
                "kernel": setting.kernel,
                "setting": setting.label,
                "us": sum(parts) if main else None,
                "parts_us": " + ".join(f"{t:.2f}" for t in parts),
                "samples": len(main),
                "bytes": read_bytes(setting.kernel, shape, args.rows, args.length),
            }
        )
    return rows


def render(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"# Decode kernel sweep: {args.model}, {args.rows} row(s), cache {args.length}",
        "",
        f"GPU time per call (median over {args.layers} layers x {args.repeats} repeats), bytes "
        f"at {args.bandwidth:.0f} GB/s. Launch gaps not included.",
        "",
        "| kernel | setting | us per call | its kernels' us | % of bandwidth | vs default |",
        "|---|---|---:|---:|---:|---:|",
    ]
    defaults = {r["kernel"]: r["us"] for r in rows if r["setting"] == "default"}
    best: dict[str, dict] = {}
    for r in rows:
        if r["us"] is None:
            lines.append(f"| {r['kernel']} | {r['setting']} | - | - | - | - |")
            continue
        ideal_us = r["bytes"] / (args.bandwidth * 1e3)
        base = defaults.get(r["kernel"])
        ratio = f"{base / r['us']:.2f}x" if base else "-"
        lines.append(
            f"| {r['kernel']} | {r['setting']} | {r['us']:.2f} | {r['parts_us']} | "
            f"{100 * ideal_us / r['us']:.0f}% | {ratio} |"
        )
        if r["kernel"] not in best or r["us"] < best[r["kernel"]]["us"]:
            best[r["kernel"]] = r
    lines += ["", "Fastest per kernel:", ""]
    for kernel, r in best.items():
        base = defaults.get(kernel)
        gain = f", {base / r['us']:.2f}x the default" if base else ""
        lines.append(f"- {kernel}: {r['setting']} ({r['us']:.2f} us{gain})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    parser.add_argument("--kernels", default=",".join(GRID), help="comma list of " + ",".join(GRID))
    parser.add_argument(
        "--defaults-only", default="", help="comma list of kernels timed at their default alone"
    )
    parser.add_argument(
        "--match", default="", help="only the settings whose label contains this (and defaults)"
    )
    parser.add_argument("--rows", type=int, default=1, help="token rows (batch x 1)")
    parser.add_argument("--length", type=int, default=1536, help="KV cache slots")
    parser.add_argument(
        "--index",
        type=int,
        help="the new token's cache slot (attention reads up to it); default: two thirds of "
        "--length, the average of a 512-token prompt decoding 1,024 tokens into 1,536 slots",
    )
    parser.add_argument("--layers", type=int, default=8, help="weight sets per call")
    parser.add_argument("--repeats", type=int, default=5, help="calls of each setting traced")
    parser.add_argument("--bandwidth", type=float, default=3800.0, help="copy GB/s, for %%")
    parser.add_argument("--lower-only", action="store_true", help="lower every setting, no GPU")
    parser.add_argument("--out", type=Path, help="write the markdown table here")
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(GRID))
    if unknown or not kernels:
        parser.error(f"--kernels takes some of {','.join(GRID)} (got {','.join(unknown)})")
    if min(args.rows, args.length, args.layers, args.repeats) < 1:
        parser.error("--rows, --length, --layers and --repeats must be >= 1")
    if args.index is not None and not 0 <= args.index < args.length:
        parser.error("--index must be a slot of the cache: 0 <= index < --length")
    shape = MODELS[args.model]
    todo = settings(kernels, frozenset(k for k in args.defaults_only.split(",") if k), args.match)
    if args.lower_only:
        return lower_all(args, todo, shape)
    report = render(measure(args, todo, shape), args)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
