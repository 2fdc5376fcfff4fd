"""Policy-model benchmark: decode throughput and one SFT step, JAX against transformers/torch.

    python -m bench.learner_bench --models 0.5b --out runs/learner_0p5b.json   # a GPU host
    python -m bench.learner_bench --models 1.5b --out runs/learner_1p5b.json
    python -m bench.learner_bench --quick --out /tmp/learner_quick.json        # CPU smoke run

Random weights in the real Qwen2.5-0.5B / 1.5B shapes (bf16), prompts of 512 random tokens,
1,024 greedy new tokens, no EOS. For each model:

1. Decode tokens/s at batch 1, 16, 64, 256 for this package's sampler (jitted prefill, then a
   decode `while_loop` that checks "all rows done" every --chunk tokens) and for
   `transformers`' `generate` (its defaults: SDPA attention, dynamic cache) on the same GPU;
   prefill is timed apart and left out of both.
2. The memory-bandwidth bound of each decode: per step, every weight byte plus the KV cache of
   the tokens so far is read once; the sum over the steps, divided by a measured copy
   bandwidth, is the fastest any implementation could go.
3. One SFT train step (bf16 compute, float32 master weights and AdamW, sequence 2,048, loss
   on every token, chunked output projection, cuDNN flash attention; if that fails, XLA
   attention with per-layer remat): tokens/s and MFU against a measured bf16 matmul peak
   (causal attention counted at half its square).
4. Peak device memory of each. JAX's peak only grows within a process, so the decode batches
   run smallest first and each reports the peak so far.

Every measurement runs in its own subprocess (JAX and torch never share the GPU at once; JAX
gets XLA_PYTHON_CLIENT_MEM_FRACTION=0.90 while it runs alone). Results print as a table and go
to --out as JSON with a markdown copy beside it, rewritten after every subprocess so a run cut
short keeps what it measured. --skip torch,train,decode and --batches trim a run; --unfused
runs the decode rows on the model's modules instead of the fused decode weights (an A/B);
--decode-kernels xla,pallas gives one decode row per kernel choice of the fused path (XLA's
fusions, or the Pallas kernels of `learner.generate.decode_kernels`, used at batch <= 8), an A/B in
one run; the default, auto, is the sampler's own choice (Pallas at batch <= 2 on a GPU).

Decode diagnostics (what a decode step costs, kernel by kernel):

    python -m bench.learner_bench --models 0.5b --profile-decode runs/trace --out runs/profile
    python -m bench.learner_bench --models 0.5b --hlo-count --batches 1,64   # any backend

--profile-decode traces a short greedy decode (--profile-new tokens, batch --profile-batch) of
the first model per path (--paths fused,module,pallas; pallas is the fused path on the Pallas
kernels) under `jax.profiler.trace` and prints the GPU
kernels of one step from the `*.trace.json.gz` it writes: name, count and time per step. On a
CPU it says there is no GPU trace. --hlo-count compiles the decode program from shapes alone
(no weights) and counts the kernel-launching instructions of its per-token loop body, so two
versions of the step can be compared without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.xla_kernels import decode_step_kernels, gpu_kernels_from_trace, kernel_table

# Qwen2.5 shapes (the Coder models share them). Plain dicts: the torch worker imports no jax.
MODELS: dict[str, dict[str, Any]] = {
    "0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "1.5b": {
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
}
for _cfg in MODELS.values():
    _cfg.update(
        model_type="qwen2",
        hidden_act="silu",
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
    )

TARGETS = {"bound_b1": 0.50, "bound_b64": 0.25, "bound_b256": 0.25, "mfu_1.5b": 0.40}
# `learner.generate.decode.DECODE_KERNELS` (the driver imports no jax: it must not touch the GPU).
DECODE_KERNELS = ("auto", "xla", "pallas")
# --paths of the decode diagnostics: the fused path, the module path, the fused path on Pallas.
PATHS = {"fused": (True, "xla"), "module": (False, "xla"), "pallas": (True, "pallas")}
GIB = 2**30


# --------------------------------------------------------------------------------------------
# Arithmetic shared by workers and report
# --------------------------------------------------------------------------------------------


def shape_facts(hf: dict[str, Any]) -> dict[str, int]:
    """Parameter counts and per-token KV bytes (bf16) of a config."""
    m, f, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    heads, kv, v = hf["num_attention_heads"], hf["num_key_value_heads"], hf["vocab_size"]
    d = m // heads
    attn = m * heads * d + 2 * m * kv * d + heads * d * m + (heads + 2 * kv) * d  # + biases
    per_layer = attn + 3 * m * f + 2 * m
    embed = v * m
    head = 0 if hf["tie_word_embeddings"] else v * m
    params = layers * per_layer + embed + head + m
    matmul = layers * (m * heads * d + 2 * m * kv * d + heads * d * m + 3 * m * f) + v * m
    return {
        "params": params,
        "matmul_params": matmul,
        "kv_bytes_per_token": layers * 2 * kv * d * 2,
        "head_dim": d,
    }


def decode_bound_seconds(
    hf: dict[str, Any], batch: int, prompt: int, new: int, bandwidth: float
) -> float:
    """Fastest possible decode of `new` tokens: all weights + the KV so far, read once a step."""
    facts = shape_facts(hf)
    weight_bytes = facts["params"] * 2
    kv = facts["kv_bytes_per_token"] * batch
    total = sum(weight_bytes + kv * (prompt + t) for t in range(new))
    return total / bandwidth


def train_flops(hf: dict[str, Any], batch: int, seq: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward), causal attention."""
    facts = shape_facts(hf)
    tokens = batch * seq
    dense = 6 * facts["matmul_params"] * tokens
    attention = (
        6
        * hf["num_hidden_layers"]
        * hf["num_attention_heads"]
        * facts["head_dim"]
        * seq
        * seq
        * batch
    )
    return float(dense + attention)


# --------------------------------------------------------------------------------------------
# Workers (each runs in its own process)
# --------------------------------------------------------------------------------------------


def _jax_peak() -> int | None:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _timed(fn: Any, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def worker_calibrate(spec: dict[str, Any]) -> dict[str, Any]:
    """Copy bandwidth (read + write bytes / s, float32 add) and bf16 matmul FLOP/s."""
    import jax
    import jax.numpy as jnp

    n = spec["copy_elems"]
    x = jnp.ones((n,), jnp.float32)
    copy = jax.jit(lambda a: a + 1.0)
    copy(x).block_until_ready()
    t_copy = _timed(lambda: copy(x).block_until_ready(), spec["repeats"])
    k = spec["matmul"]
    a = jnp.ones((k, k), jnp.bfloat16)
    b = jnp.ones((k, k), jnp.bfloat16)
    mm = jax.jit(lambda p, q: p @ q)
    mm(a, b).block_until_ready()
    t_mm = _timed(lambda: mm(a, b).block_until_ready(), spec["repeats"])
    return {
        "device": jax.devices()[0].device_kind,
        "copy_bandwidth": 2 * n * 4 / t_copy,
        "matmul_flops": 2 * k**3 / t_mm,
    }


def _decode_inputs(vocab: int, batch: int, prompt: int) -> dict[str, Any]:
    """Random prompts (no padding) and the per-row inputs of a greedy decode with no stops."""
    import numpy as np

    rng = np.random.default_rng(batch)
    return {
        "tokens": rng.integers(0, vocab, size=(batch, prompt)).astype(np.int32),
        "starts": np.zeros(batch, np.int32),
        "seeds": np.arange(batch, dtype=np.uint32),
        "stops": np.full((batch, 0, 1), -1, np.int32),
        "eos": np.zeros((0,), np.int32),
        "base_seed": np.uint32(0),
    }


def _decode_options(new: int, chunk: int, fused: bool, kernels: str = "xla") -> dict[str, Any]:
    return {
        "max_new": new,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "pad_id": 0,
        "chunk": chunk,
        "fused": fused,
        "kernels": kernels,
    }


def _jax_decode_batch(
    engine: Any,
    batch: int,
    prompt: int,
    new: int,
    chunk: int,
    fused: bool = True,
    kernels: str = "xla",
    repeats: int = 1,
) -> dict[str, Any]:
    """Time prefill and decode of one batch (greedy, no stops) after a warm-up run.

    The decode is timed `repeats` times, each from a fresh prefill: one run moves by a few
    percent from the next, and the rate is the median's.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from learner.generate import sampler

    inputs = _decode_inputs(engine.config.vocab_size, batch, prompt)
    tokens, starts, seeds = inputs["tokens"], inputs["starts"], inputs["seeds"]
    stops, eos, base_seed = inputs["stops"], inputs["eos"], inputs["base_seed"]
    cache_len = prompt + sampler.decode_steps(new, chunk)
    options = _decode_options(new, chunk, fused, kernels)

    def run_prefill() -> Any:
        out = sampler.prefill(
            engine.graphdef,
            engine.state,
            tokens,
            starts,
            cache_len=cache_len,
            cache_dtype=jnp.bfloat16,
        )
        return jax.block_until_ready(out)

    def run_decode(cache: Any, logits: Any) -> Any:
        out, _ = sampler.decode(
            engine.graphdef,
            engine.state,
            cache,
            logits,
            starts,
            seeds,
            stops,
            eos,
            base_seed,
            **options,
        )
        return jax.block_until_ready(out)

    start = time.perf_counter()
    run_decode(*run_prefill())  # compile both and warm up
    compile_s = time.perf_counter() - start
    t_prefill = _timed(run_prefill, 2)
    times = []
    for _ in range(repeats):
        cache, logits = run_prefill()
        start = time.perf_counter()
        out = run_decode(cache, logits)
        times.append(time.perf_counter() - start)
        if int(np.asarray(out[2]).min()) != new:
            raise RuntimeError("a row stopped early")
    t_decode = statistics.median(times)
    return {
        "compile_and_first_run_s": compile_s,
        "prefill_s": t_prefill,
        "decode_s": t_decode,
        "decode_runs_s": times,
        "decode_spread": (max(times) - min(times)) / t_decode,
        "tokens_per_s": batch * new / t_decode,
        "peak_bytes": _jax_peak(),
    }


def worker_jax_decode(spec: dict[str, Any]) -> dict[str, Any]:
    from learner.generate import sampler
    from learner.model import io as model_io
    from learner.model import qwen2

    cfg = qwen2.Qwen2Config.from_hf(MODELS[spec["model"]], param_dtype="bfloat16", dtype="bfloat16")
    engine = sampler.Sampler(model_io.random_model(cfg, seed=0))
    results = []
    for batch in spec["batches"]:
        row: dict[str, Any] = {"batch": batch}
        try:
            row.update(
                _jax_decode_batch(
                    engine,
                    batch,
                    spec["prompt"],
                    spec["new"],
                    spec["chunk"],
                    spec.get("fused", True),
                    spec.get("kernels", "xla"),
                    spec.get("repeats", 1),
                )
            )
        except Exception as err:  # one batch failing (say, out of memory) must not hide the rest
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        results.append(row)
    return {"model": spec["model"], "kernels": spec.get("kernels", "xla"), "rows": results}


def worker_torch_decode(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = MODELS[spec["model"]]
    torch.manual_seed(0)
    config = Qwen2Config(**{k: v for k, v in hf.items() if k != "model_type"})
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    prompt, new = spec["prompt"], spec["new"]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    results = []
    for batch in spec["batches"]:
        row: dict[str, Any] = {"batch": batch}
        try:
            ids = torch.randint(0, hf["vocab_size"], (batch, prompt), device=device)
            mask = torch.ones_like(ids)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():
                model.generate(
                    ids[:, :8], attention_mask=mask[:, :8], max_new_tokens=4, do_sample=False
                )  # warm-up
                sync()
                t_prefill = math.inf
                for _ in range(2):
                    start = time.perf_counter()
                    model(ids, attention_mask=mask, logits_to_keep=1)
                    sync()
                    t_prefill = min(t_prefill, time.perf_counter() - start)
                start = time.perf_counter()
                out = model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                )
                sync()
                t_total = time.perf_counter() - start
            assert out.shape[1] == prompt + new
            t_decode = max(t_total - t_prefill, 1e-9)
            peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
            row.update(
                prefill_s=t_prefill,
                decode_s=t_decode,
                tokens_per_s=batch * new / t_decode,
                peak_bytes=peak,
            )
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            if device == "cuda":
                torch.cuda.empty_cache()
        results.append(row)
    return {"model": spec["model"], "rows": results, "torch": torch.__version__}


def _train_once(spec: dict[str, Any], attention: str, remat: bool) -> dict[str, Any]:
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from learner.model import io as model_io
    from learner.model import logprobs, qwen2

    hf = MODELS[spec["model"]]
    cfg = qwen2.Qwen2Config.from_hf(
        hf, param_dtype="float32", dtype="bfloat16", attention_impl=attention, remat=remat
    )
    graphdef, state = nnx.split(model_io.random_model(cfg, seed=0))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.1))
    opt_state = optimizer.init(state)
    # Placed (committed) like the step's outputs: else the second step compiles again.
    state, opt_state = jax.device_put((state, opt_state), jax.devices()[0])

    def loss_fn(state: Any, tokens: Any) -> Any:
        model = nnx.merge(graphdef, state)
        return -logprobs.next_token_logprobs(model, tokens, chunk=spec["chunk"]).mean()

    def step(state: Any, opt_state: Any, tokens: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(state, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    batch, seq = spec["batch"], spec["seq"]
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, hf["vocab_size"], size=(batch, seq)).astype(np.int32)
    start = time.perf_counter()
    state, opt_state, loss = step(state, opt_state, tokens)
    jax.block_until_ready(loss)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(spec["steps"]):
        start = time.perf_counter()
        state, opt_state, loss = step(state, opt_state, tokens)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    return {
        "model": spec["model"],
        "batch": batch,
        "seq": seq,
        "attention": attention,
        "remat": remat,
        "compile_and_first_step_s": compile_s,
        "step_s": step_s,
        "step_min_s": min(times),
        "step_max_s": max(times),
        "tokens_per_s": batch * seq / step_s,
        "model_flops_per_step": train_flops(hf, batch, seq),
        "loss": float(loss),
        "peak_bytes": _jax_peak(),
    }


def worker_jax_train(spec: dict[str, Any]) -> dict[str, Any]:
    """One SFT step; if cuDNN attention or the memory fails, XLA attention with remat instead."""
    import gc

    import jax

    on_gpu = jax.devices()[0].platform == "gpu"
    attempts = [("cudnn" if on_gpu and spec["attention"] == "cudnn" else "xla", spec["remat"])]
    if attempts[0] != ("xla", True):
        attempts.append(("xla", True))
    failures = []
    for attention, remat in attempts:
        try:
            result = _train_once(spec, attention, remat)
            return {**result, "fallback_from": failures} if failures else result
        except Exception as err:
            failures.append(
                f"{attention}{'+remat' if remat else ''}: {type(err).__name__}: {str(err)[:200]}"
            )
            gc.collect()
    raise RuntimeError(" / ".join(failures))


# --------------------------------------------------------------------------------------------
# Decode diagnostics: HLO kernels per step (any backend) and a GPU kernel profile
# --------------------------------------------------------------------------------------------


def _abstract_decode_args(cfg: Any, batch: int, prompt: int, new: int, chunk: int) -> tuple:
    """Shape-only arguments of `sampler.decode` (bf16 cache): compile without any weights."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from learner.generate import sampler
    from learner.model import qwen2

    graphdef, state = nnx.split(qwen2.abstract(cfg))
    length = prompt + sampler.decode_steps(new, chunk)
    kv = jax.ShapeDtypeStruct((batch, cfg.num_kv_heads, length, cfg.head_dim), jnp.bfloat16)
    cache = tuple(qwen2.LayerCache(kv, kv) for _ in range(cfg.num_layers))

    def sds(shape: tuple[int, ...], dtype: Any) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype)

    return (
        graphdef,
        state,
        cache,
        sds((batch, cfg.vocab_size), jnp.float32),
        sds((batch,), jnp.int32),
        sds((batch,), jnp.uint32),
        sds((batch, 0, 1), jnp.int32),
        sds((0,), jnp.int32),
        sds((), jnp.uint32),
    )


def _bf16_config(name: str) -> Any:
    from learner.model import qwen2

    return qwen2.Qwen2Config.from_hf(MODELS[name], param_dtype="bfloat16", dtype="bfloat16")


_INTERPRETED = "the Pallas kernels run interpreted off the GPU: no kernel count here"


def worker_hlo_count(spec: dict[str, Any]) -> dict[str, Any]:
    """Kernels per decode step of the compiled program, per path (--paths), no weights."""
    import jax

    from learner.generate import sampler

    rows = []
    for name in spec["models"]:
        cfg = _bf16_config(name)
        for batch in spec["batches"]:
            args = _abstract_decode_args(cfg, batch, spec["prompt"], spec["new"], spec["chunk"])
            for path in spec["paths"]:
                if path == "pallas" and jax.devices()[0].platform != "gpu":
                    rows.append(
                        {"model": name, "batch": batch, "path": path, "error": _INTERPRETED}
                    )
                    continue
                options = _decode_options(spec["new"], spec["chunk"], *PATHS[path])
                start = time.perf_counter()
                text = sampler.decode.lower(*args, **options).compile().as_text()
                counts = decode_step_kernels(text, spec["chunk"])
                counts.pop("loop_op_names", None)
                counts.pop("all_op_names", None)
                rows.append(
                    {
                        "model": name,
                        "batch": batch,
                        "path": path,
                        "compile_s": time.perf_counter() - start,
                        **counts,
                    }
                )
    return {"platform": jax.devices()[0].platform, "rows": rows}


def worker_jax_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """Trace a short greedy decode per path; the GPU kernels of one step and the HLO count."""
    import jax
    import jax.numpy as jnp

    from learner.generate import sampler
    from learner.model import io as model_io

    cfg = _bf16_config(spec["model"])
    engine = sampler.Sampler(model_io.random_model(cfg, seed=0))
    batch, prompt, new, chunk = spec["batch"], spec["prompt"], spec["new"], spec["chunk"]
    steps = sampler.decode_steps(new, chunk)
    inputs = _decode_inputs(cfg.vocab_size, batch, prompt)
    platform = jax.devices()[0].platform

    def prefill() -> Any:
        return jax.block_until_ready(
            sampler.prefill(
                engine.graphdef,
                engine.state,
                inputs["tokens"],
                inputs["starts"],
                cache_len=prompt + steps,
                cache_dtype=jnp.bfloat16,
            )
        )

    row_args = (inputs["starts"], inputs["seeds"], inputs["stops"], inputs["eos"])
    base_seed = inputs["base_seed"]
    results: dict[str, Any] = {"model": spec["model"], "batch": batch, "platform": platform}
    for path in spec["paths"]:
        options = _decode_options(new, chunk, *PATHS[path])
        cache, logits = prefill()
        args = (engine.graphdef, engine.state, cache, logits, *row_args, base_seed)
        compiled = sampler.decode.lower(*args, **options).compile()
        trace_dir = Path(spec["trace_dir"]) / f"{spec['model']}-b{batch}-{path}"
        trace_dir.mkdir(parents=True, exist_ok=True)
        (trace_dir / "decode.hlo.txt").write_text(compiled.as_text())
        counts = decode_step_kernels(compiled.as_text(), chunk)
        loop_ops = set(counts.pop("loop_op_names", []))
        all_ops = set(counts.pop("all_op_names", []))

        def run(cache: Any, logits: Any, compiled: Any = compiled) -> float:
            start = time.perf_counter()
            jax.block_until_ready(compiled(engine.state, cache, logits, *row_args, base_seed))
            return time.perf_counter() - start

        run(*prefill())  # warm-up (autotuning, first launch)
        wall = run(*prefill())
        cache, logits = prefill()  # the trace holds the decode program alone
        with jax.profiler.trace(str(trace_dir)):
            run(cache, logits)
        entry: dict[str, Any] = {
            "hlo": counts,
            "wall_ms_per_step": 1e3 * wall / steps,
            "trace_dir": str(trace_dir),
        }
        kernels = gpu_kernels_from_trace(trace_dir)
        if path == "pallas" and platform != "gpu":
            entry["hlo"] = {}
            entry["note"] = _INTERPRETED
        elif kernels is None:
            entry["note"] = f"no GPU in this trace (platform {platform}): no kernel table"
        else:
            ours = [k for k in kernels if k["module"] in (None, counts.get("module"))]
            entry["profile"] = kernel_table(ours, loop_ops, all_ops, steps)
        results[path] = entry
    return results


WORKERS = {
    "calibrate": worker_calibrate,
    "jax_decode": worker_jax_decode,
    "torch_decode": worker_torch_decode,
    "jax_train": worker_jax_train,
    "hlo_count": worker_hlo_count,
    "jax_profile": worker_jax_profile,
}


def _worker_main(kind: str, spec_json: str) -> None:
    try:
        result = WORKERS[kind](json.loads(spec_json))
    except Exception as err:
        traceback.print_exc()
        result = {
            "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
        }
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def _spawn(
    kind: str, spec: dict[str, Any], *, quick: bool, timeout: float, xla_flags: str
) -> dict[str, Any]:
    env = dict(os.environ)
    if kind != "torch_decode":
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.90"
        if not quick:
            env.setdefault(
                "JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache" / "drtriton-jax")
            )
        if xla_flags:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
        if quick:
            env["JAX_PLATFORMS"] = "cpu"
    else:
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if quick:
            env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [
        sys.executable,
        "-m",
        "bench.learner_bench",
        "--worker",
        kind,
        "--spec",
        json.dumps(spec),
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=Path(__file__).resolve().parents[1],
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:400]}"}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["wall_s"] = time.perf_counter() - start
    if "error" in result:
        print(proc.stderr[-2000:], file=sys.stderr)
    return result


def _gib(value: Any) -> str:
    return f"{value / GIB:.1f}" if isinstance(value, int | float) else "-"


def _fmt(value: Any, spec: str = ".0f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def _rows_by_batch(result: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """A decode worker's rows keyed by batch, so JAX and torch rows of one batch pair up."""
    return {r["batch"]: r for r in (result or {}).get("rows", [])}


def _bound_tokens_per_s(
    args: argparse.Namespace, hf: dict[str, Any], batch: int, bandwidth: float | None
) -> float | None:
    """The fastest decode the measured copy bandwidth allows (None without a measurement)."""
    if not bandwidth:
        return None
    return batch * args.new / decode_bound_seconds(hf, batch, args.prompt, args.new, bandwidth)


def _decode_row(
    name: str,
    kernels: str,
    batch: int,
    rows: tuple[dict[str, Any], dict[str, Any]],
    bound: float | None,
) -> dict[str, Any]:
    """One decode row: the JAX and torch numbers of a batch (`rows`) beside the bandwidth
    bound, so each speed reads against both the other library and the hardware."""
    j, t = rows
    return {
        "model": name,
        "batch": batch,
        "kernels": kernels,
        "jax_tokens_per_s": j.get("tokens_per_s"),
        "jax_spread": j.get("decode_spread"),
        "torch_tokens_per_s": t.get("tokens_per_s"),
        "bound_tokens_per_s": bound,
        "jax_vs_torch": j["tokens_per_s"] / t["tokens_per_s"]
        if "tokens_per_s" in j and "tokens_per_s" in t
        else None,
        "fraction_of_bound": j["tokens_per_s"] / bound if "tokens_per_s" in j and bound else None,
        "jax_prefill_s": j.get("prefill_s"),
        "torch_prefill_s": t.get("prefill_s"),
        "jax_peak_bytes": j.get("peak_bytes"),
        "torch_peak_bytes": t.get("peak_bytes"),
        "jax_compile_s": j.get("compile_and_first_run_s"),
        "errors": "; ".join(e for e in (j.get("error"), t.get("error")) if e) or None,
    }


def _decode_rows(
    results: dict[str, Any], args: argparse.Namespace, name: str, bandwidth: float | None
) -> list[dict[str, Any]]:
    """A model's decode rows, kernel choice by kernel choice, each over every batch."""
    hf = MODELS[name]
    torch_rows = _rows_by_batch(results.get(f"torch_decode/{name}"))
    rows = []
    for kernels, batch in [(k, b) for k in args.decode_kernels for b in args.batches]:
        jax_rows = _rows_by_batch(results.get(decode_key(name, kernels)))
        pair = (jax_rows.get(batch, {}), torch_rows.get(batch, {}))
        bound = _bound_tokens_per_s(args, hf, batch, bandwidth)
        rows.append(_decode_row(name, kernels, batch, pair, bound))
    return rows


def _decode_check(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | None:
    """The decode row's share-of-bound target check; none for --quick (a CPU toy) or a batch
    without a target."""
    target = None if args.quick else TARGETS.get(f"bound_b{row['batch']}")
    if target is None or row["fraction_of_bound"] is None:
        return None
    # Name the kernels only when several were run: the targets would read alike otherwise.
    label = f" ({row['kernels']} kernels)" if len(args.decode_kernels) > 1 else ""
    return {
        "what": f"{row['model']} decode b{row['batch']}{label} >= {target:.0%} of bound",
        "value": row["fraction_of_bound"],
        "pass": row["fraction_of_bound"] >= target,
    }


def _train_row(train: dict[str, Any], name: str, peak: float | None) -> dict[str, Any]:
    """The train worker's result with its MFU against the measured matmul peak."""
    mfu = (
        train["model_flops_per_step"] / train["step_s"] / peak
        if "step_s" in train and peak
        else None
    )
    return {**train, "mfu": mfu, "model": name}


def _train_check(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | None:
    """The train row's MFU target check; none for --quick or a model without a target."""
    target = None if args.quick else TARGETS.get(f"mfu_{row['model']}")
    if target is None or row["mfu"] is None:
        return None
    return {
        "what": f"{row['model']} SFT step MFU >= {target:.0%}",
        "value": row["mfu"],
        "pass": row["mfu"] >= target,
    }


def _report_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the numbers depend on, kept in the report so runs can be compared."""
    return {
        "models": args.models,
        "batches": args.batches,
        "prompt": args.prompt,
        "new_tokens": args.new,
        "train_batch": args.train_batch,
        "train_seq": args.train_seq,
        "quick": args.quick,
        "decode_path": "module" if args.unfused else "fused",
        "decode_kernels": args.decode_kernels,
    }


def build_report(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Derived numbers (bounds, ratios, MFU, target checks) from the raw worker results."""
    calib = results["calibration"]
    decode_rows, train_rows, checks = [], [], []
    for name in args.models:
        rows = _decode_rows(results, args, name, calib.get("copy_bandwidth"))
        decode_rows += rows
        checks += [check for row in rows if (check := _decode_check(row, args)) is not None]
        train = results.get(f"jax_train/{name}")
        if train:
            train_rows.append(_train_row(train, name, calib.get("matmul_flops")))
            if (check := _train_check(train_rows[-1], args)) is not None:
                checks.append(check)
    return {
        "settings": _report_settings(args),
        "calibration": calib,
        "decode": decode_rows,
        "train": train_rows,
        "targets": checks,
        "raw": results,
    }


def render_markdown(report: dict[str, Any]) -> str:
    s, c = report["settings"], report["calibration"]
    lines = [
        f"# Policy model benchmark ({c.get('device', '?')})",
        "",
        f"Prompt {s['prompt']} tokens, {s['new_tokens']} greedy new tokens, bf16, random weights. "
        f"Measured copy bandwidth {_fmt((c.get('copy_bandwidth') or 0) / 1e9, '.1f')} GB/s, "
        f"bf16 matmul peak {_fmt((c.get('matmul_flops') or 0) / 1e12, '.3g')} TFLOP/s.",
        "",
        "## Decode",
        "",
        "| model | batch | JAX kernels | JAX tok/s | JAX spread | torch tok/s | JAX/torch | bound tok/s | % of bound | JAX peak GiB | torch peak GiB | JAX prefill s | torch prefill s | JAX compile s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["decode"]:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r.get('kernels', 'xla')} | {_fmt(r['jax_tokens_per_s'])} | "
            f"{_fmt(100 * r['jax_spread'] if r.get('jax_spread') is not None else None, '.1f')}% | {_fmt(r['torch_tokens_per_s'])} | "
            f"{_fmt(r['jax_vs_torch'], '.2f')} | {_fmt(r['bound_tokens_per_s'])} | "
            f"{_fmt(100 * r['fraction_of_bound'] if r['fraction_of_bound'] is not None else None, '.1f')} | "
            f"{_gib(r['jax_peak_bytes'])} | {_gib(r['torch_peak_bytes'])} | {_fmt(r['jax_prefill_s'], '.3f')} | "
            f"{_fmt(r['torch_prefill_s'], '.3f')} | {_fmt(r['jax_compile_s'], '.1f')} |"
            + (f" {r['errors']}" if r["errors"] else "")
        )
    lines += [
        "",
        "## SFT train step",
        "",
        "| model | batch x seq | attention | step s (median) | min-max s | tokens/s | MFU "
        "| peak GiB | compile s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["train"]:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | - | {r['error']}")
            continue
        lines.append(
            f"| {r['model']} | {r['batch']} x {r['seq']} | {r['attention']}{' +remat' if r['remat'] else ''} | "
            f"{r['step_s']:.3f} | {_fmt(r.get('step_min_s'), '.3f')}-{_fmt(r.get('step_max_s'), '.3f')} | "
            f"{r['tokens_per_s']:.0f} | {_fmt(100 * r['mfu'] if r['mfu'] is not None else None, '.1f')}% | "
            f"{_gib(r['peak_bytes'])} | {r['compile_and_first_step_s']:.1f} |"
        )
    if report["targets"]:
        lines += ["", "## Targets", ""]
        lines += [
            f"- {'PASS' if t['pass'] else 'MISS'}: {t['what']} (measured {t['value']:.1%})"
            for t in report["targets"]
        ]
    errors = [
        f"{k}: {v['error']}"
        for k, v in report["raw"].items()
        if isinstance(v, dict) and "error" in v
    ]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict[str, Any], out: Path | None) -> Path | None:
    """The report as JSON at `out` (suffix forced to .json) and as markdown beside it."""
    if out is None:
        return None
    json_path = out if out.suffix == ".json" else out.with_suffix(".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    json_path.with_suffix(".md").write_text(render_markdown(report))
    return json_path


def decode_spec(args: argparse.Namespace, name: str, kernels: str = "xla") -> dict[str, Any]:
    return {
        "model": name,
        "batches": sorted(args.batches),
        "prompt": args.prompt,
        "new": args.new,
        "chunk": args.chunk,
        "fused": not args.unfused,
        "kernels": kernels,
        "repeats": args.decode_repeats,
    }


def decode_key(name: str, kernels: str) -> str:
    """The results key of a JAX decode run (XLA's kernels keep the key they always had)."""
    return f"jax_decode/{name}" if kernels == "xla" else f"jax_decode/{name}/{kernels}"


def sweep_xla(args: argparse.Namespace, results: dict[str, Any]) -> int:
    """JAX decode under each XLA_FLAGS variant: which compiler settings pay off on this GPU."""
    bandwidth = results["calibration"].get("copy_bandwidth")
    lines = [
        "| model | XLA_FLAGS | kernels | batch | tok/s | % of bound | compile s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name in args.models:
        for flags, kernels in [
            (f, k) for f in args.sweep_xla.split("|") for k in args.decode_kernels
        ]:
            spec = decode_spec(args, name, kernels)
            print(f"{decode_key(name, kernels)} XLA_FLAGS={flags!r} ...", flush=True)
            result = _spawn(
                "jax_decode", spec, quick=args.quick, timeout=args.timeout,
                xla_flags=f"{args.xla_flags} {flags}".strip(),
            )  # fmt: skip
            if "error" in result:
                lines.append(
                    f"| {name} | `{flags}` | {kernels} | - | error: {result['error'][:200]} | - | - |"
                )
            for row in result.get("rows", []):
                bound = (
                    row["batch"] * args.new
                    / decode_bound_seconds(MODELS[name], row["batch"], args.prompt, args.new, bandwidth)
                    if bandwidth
                    else None
                )  # fmt: skip
                share = f"{100 * row['tokens_per_s'] / bound:.1f}" if bound else "-"
                lines.append(
                    f"| {name} | `{flags or '(none)'}` | {kernels} | {row['batch']} | "
                    f"{row['tokens_per_s']:.0f} | {share} | {_fmt(row.get('compile_and_first_run_s'), '.1f')} |"
                )  # fmt: skip
            print("\n".join(lines), flush=True)
    _save_table(args.out, lines)
    return 0


def _save_table(out: Path | None, lines: list[str], result: Any = None) -> None:
    """A diagnostic's table as OUT.md, and its raw result as OUT.json when there is one."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    if result is not None:
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def hlo_count(args: argparse.Namespace) -> int:
    """Kernels per decode step of the compiled program (no weights, any backend): compare
    versions of the decode step on CPU too."""
    spec = {
        "models": args.models,
        "batches": sorted(args.batches),
        "prompt": args.prompt,
        "new": args.new,
        "chunk": args.chunk,
        "paths": args.paths,
    }
    result = _spawn(
        "hlo_count", spec, quick=args.quick, timeout=args.timeout, xla_flags=args.xla_flags
    )
    if "error" in result:
        print(f"hlo_count failed: {result['error']}")
        return 1
    lines = [
        f"HLO kernels per decode step ({result['platform']}; prompt {args.prompt}, "
        f"{args.new} new, chunk {args.chunk})",
        "",
        "| model | batch | path | kernels/step | by opcode | compile s |",
        "|---|---:|---|---:|---|---:|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['path']} | - | {r['error']} | - |")
            continue
        ops = ", ".join(
            f"{k} {v:g}" for k, v in sorted(r["by_op_per_step"].items(), key=lambda kv: -kv[1])
        )
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['path']} | {r['kernels_per_step']:g} | {ops} | "
            f"{r['compile_s']:.1f} |"
        )  # fmt: skip
    print("\n".join(lines), flush=True)
    _save_table(args.out, lines, result)
    return 0


def profile_decode(args: argparse.Namespace) -> int:
    """GPU kernels of one decode step (batch --profile-batch, first of --models), per path."""
    name = args.models[0]
    spec = {
        "model": name,
        "batch": args.profile_batch,
        "prompt": args.prompt,
        "new": args.profile_new,
        "chunk": args.chunk,
        "paths": args.paths,
        "trace_dir": str(args.profile_decode.resolve()),
    }
    result = _spawn(
        "jax_profile", spec, quick=args.quick, timeout=args.timeout, xla_flags=args.xla_flags
    )
    if "error" in result:
        print(f"profile failed: {result['error']}")
        return 1
    lines = [f"# Decode step profile: {name}, batch {args.profile_batch}, prompt {args.prompt}", ""]
    for path in args.paths:
        entry = result[path]
        hlo = entry["hlo"]
        lines += [
            f"## path {path} ({result['platform']})",
            "",
            f"HLO kernels per step: {_fmt(hlo.get('kernels_per_step'), 'g')} "
            f"({', '.join(f'{k} {v:g}' for k, v in hlo.get('by_op_per_step', {}).items())}); "
            f"wall {entry['wall_ms_per_step']:.3f} ms per step; trace in {entry['trace_dir']}",
            "",
        ]  # fmt: skip
        if "profile" not in entry:
            lines += [entry.get("note", "no kernel table"), ""]
            continue
        prof = entry["profile"]
        lines += [
            f"GPU kernels per step: {prof['kernels_per_step']:g}, kernel time "
            f"{prof['kernel_us_per_step']:.1f} us per step, GPU span {prof['gpu_span_us_per_step']:.1f} us "
            f"per step ({prof['outside_loop_kernels']} kernels of the program ran outside the loop)",
            "",
            "| kernel | count/step | us/step | us each |",
            "|---|---:|---:|---:|",
        ]  # fmt: skip
        for row in prof["rows"]:
            each = row["us_per_step"] / row["per_step"] if row["per_step"] else 0.0
            lines.append(
                f"| `{row['kernel']}` | {row['per_step']:g} | {row['us_per_step']:.1f} | {each:.2f} |"
            )
        lines.append("")
    print("\n".join(lines), flush=True)
    _save_table(args.out, lines, result)
    return 0


def _add_shape_args(parser: argparse.ArgumentParser) -> None:
    """What to measure: models, decode shapes and where the report goes."""
    parser.add_argument(
        "--quick", action="store_true", help="tiny model on CPU: proves the harness runs"
    )
    parser.add_argument("--out", type=Path, help="write the report here (JSON) and a .md beside it")
    parser.add_argument("--models", default=None, help="comma list of 0.5b,1.5b (default both)")
    parser.add_argument("--batches", default=None, help="comma list (default 1,16,64,256)")
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--new", type=int, default=None, help="new tokens per row")
    parser.add_argument(
        "--chunk", type=int, default=8, help="decode steps per on-device loop check"
    )
    parser.add_argument(
        "--decode-repeats",
        type=int,
        default=None,
        help="timed decodes per batch, the median reported (default 5; 2 with --quick)",
    )


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    """The SFT train step's shape and kernels."""
    parser.add_argument("--train-batch", type=int, default=None)
    parser.add_argument("--train-seq", type=int, default=None)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument(
        "--remat", action="store_true", help="recompute layer activations in the train step"
    )
    parser.add_argument(
        "--attention", choices=["cudnn", "xla"], default="cudnn", help="train-step attention kernel"
    )


def _add_variant_args(parser: argparse.ArgumentParser) -> None:
    """Trimming a run and A/B variants of the decode (compiler flags, path, kernels)."""
    parser.add_argument(
        "--skip", default="", help="comma list of parts to skip: torch,train,decode"
    )
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for the JAX workers")
    parser.add_argument(
        "--sweep-xla",
        default="",
        help="'|'-separated XLA_FLAGS variants ('' = none): JAX decode only, one row per variant",
    )
    parser.add_argument(
        "--unfused",
        action="store_true",
        help="decode rows on the model's modules instead of the fused decode weights (A/B)",
    )
    parser.add_argument(
        "--decode-kernels",
        default="auto",
        help="comma list of the fused decode's kernels, one decode row each: auto,xla,pallas "
        "(pallas: hand-written Pallas kernels at batch <= 8, XLA's above; auto: the "
        "sampler's default, Pallas at batch <= 2 on a GPU)",
    )


def _add_diagnostic_args(parser: argparse.ArgumentParser) -> None:
    """The decode diagnostics (--profile-decode, --hlo-count) instead of the benchmark."""
    parser.add_argument(
        "--profile-decode",
        type=Path,
        metavar="DIR",
        help="trace a short decode of the first --models into DIR; print one step's GPU kernels",
    )
    parser.add_argument("--profile-batch", type=int, default=1)
    parser.add_argument(
        "--profile-new", type=int, default=64, help="new tokens in the traced decode"
    )
    parser.add_argument(
        "--hlo-count",
        action="store_true",
        help="kernels per decode step of the compiled program (no weights; any backend)",
    )
    parser.add_argument(
        "--paths",
        default="fused,module",
        help="decode paths for --profile-decode and --hlo-count: fused,module,pallas "
        "(pallas: the fused path on the Pallas kernels; needs a GPU)",
    )


def _add_worker_args(parser: argparse.ArgumentParser) -> None:
    """The worker subprocesses: their time limit, and the hidden flags that start one."""
    parser.add_argument("--timeout", type=float, default=1800, help="per worker, seconds")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    """The command line (the groups are added in --help's order)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _add_shape_args(parser)
    _add_train_args(parser)
    _add_variant_args(parser)
    _add_diagnostic_args(parser)
    _add_worker_args(parser)
    return parser


def _resolve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the defaults (a tiny CPU preset under --quick, the real shapes otherwise), parse
    the comma lists, and stop with a usage error on values no worker could run."""
    q = args.quick
    args.models = (args.models or ("tiny" if q else "0.5b,1.5b")).split(",")
    args.batches = [int(b) for b in (args.batches or ("1,2" if q else "1,16,64,256")).split(",")]
    args.prompt = args.prompt or (16 if q else 512)
    args.new = args.new or (8 if q else 1024)
    if args.decode_repeats is None:
        args.decode_repeats = 2 if q else 5
    if args.decode_repeats < 1:
        parser.error("--decode-repeats must be >= 1")
    args.train_batch = args.train_batch or (2 if q else 8)
    args.train_seq = args.train_seq or (64 if q else 2048)
    args.paths = [p for p in args.paths.split(",") if p]
    if not set(args.paths) <= set(PATHS):
        parser.error(f"--paths takes some of {','.join(PATHS)}")
    args.decode_kernels = list(dict.fromkeys(k for k in args.decode_kernels.split(",") if k))
    if not args.decode_kernels or not set(args.decode_kernels) <= set(DECODE_KERNELS):
        parser.error(f"--decode-kernels takes some of {','.join(DECODE_KERNELS)}")
    if args.unfused and "pallas" in args.decode_kernels:
        parser.error("--decode-kernels pallas needs the fused path (drop --unfused)")


def _record(
    results: dict[str, Any], key: str, kind: str, spec: dict[str, Any], args: argparse.Namespace
) -> None:
    """Run one worker into `results[key]`, print how long it took, and rewrite the report so
    partial results survive a kill."""
    print(f"{key} ...", end=" ", flush=True)
    results[key] = _spawn(
        kind, spec, quick=args.quick, timeout=args.timeout, xla_flags=args.xla_flags
    )
    status = results[key].get("error", "ok")
    print(f"{results[key].get('wall_s', 0):.0f} s, {status}", flush=True)
    write_outputs(build_report(results, args), args.out)


def _calibration_spec(quick: bool) -> dict[str, Any]:
    """Copy and matmul sizes of the bandwidth and peak-FLOP/s measurements."""
    return {
        "copy_elems": 2**20 if quick else 2**30,
        "matmul": 512 if quick else 8192,
        "repeats": 3 if quick else 10,
    }


def _train_spec(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The SFT train step worker's spec for one model."""
    return {
        "model": name,
        "batch": args.train_batch,
        "seq": args.train_seq,
        "steps": args.train_steps,
        "remat": args.remat,
        "attention": args.attention,
        "chunk": 16 if args.quick else 512,
    }


def _measure_model(
    args: argparse.Namespace, results: dict[str, Any], name: str, skip: set[str]
) -> None:
    """One model's parts not in `skip`: JAX decode per kernel choice, torch decode, train."""
    spec = decode_spec(args, name)
    if "decode" not in skip:
        for kernels in args.decode_kernels:
            key = decode_key(name, kernels)
            _record(results, key, "jax_decode", decode_spec(args, name, kernels), args)
    if "torch" not in skip:
        _record(results, f"torch_decode/{name}", "torch_decode", spec, args)
    if "train" not in skip:
        _record(results, f"jax_train/{name}", "jax_train", _train_spec(args, name), args)


def run_benchmark(args: argparse.Namespace) -> int:
    """Calibrate, then measure every model part by part, each in its own worker; print the
    table and write the report (or, with --sweep-xla, the decode under each flag variant)."""
    results: dict[str, Any] = {}
    _record(results, "calibration", "calibrate", _calibration_spec(args.quick), args)
    if args.sweep_xla:
        return sweep_xla(args, results)
    skip = set(filter(None, args.skip.split(",")))
    for name in args.models:
        _measure_model(args, results, name, skip)
    report = build_report(results, args)
    print()
    print(render_markdown(report))
    if args.out:
        json_path = write_outputs(report, args.out)
        print(f"wrote {json_path} and {json_path.with_suffix('.md')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """A worker (--worker), a diagnostic (--hlo-count, --profile-decode) or the benchmark."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker, args.spec)
        return 0
    _resolve_args(parser, args)
    if args.hlo_count:
        return hlo_count(args)
    if args.profile_decode:
        return profile_decode(args)
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
