"""`drtriton model ...`, `drtriton tokenizer ...` and `drtriton sample`.

Registration imports nothing heavy; each handler imports jax (and the rest) when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DTYPE_CHOICES = ("float32", "bfloat16", "float16")


def _usage(message: str) -> Exception:
    """A `drtriton_cli.UsageError` (exit status 2, one line on stderr)."""
    # Under `python -m drtriton_cli` the running module is `__main__`, not `drtriton_cli`, and
    # only its own class is caught.
    main = sys.modules.get("__main__")
    if str(getattr(main, "__file__", "")).endswith("drtriton_cli.py"):
        return main.UsageError(message)  # type: ignore[union-attr]
    from drtriton_cli import UsageError

    return UsageError(message)


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise _usage(f"--token-ids wants comma-separated integers, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise _usage(f"--token-ids wants non-negative integers, got {text!r}")
    return ids


def _size(text: str) -> int:
    units = {
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "B": 1,
    }
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


def _mesh(spec: str | None) -> Any:
    if not spec:
        return None
    from learner.sharding import make_mesh

    try:
        fsdp, tp = (int(x) for x in spec.lower().split("x"))
        return make_mesh(fsdp, tp)
    except ValueError as err:
        raise _usage(f"--mesh {spec}: {err}") from None


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Any, list[int]]:
    """(model, facts, tokenizer or None, eos ids) for --model, with errors as usage errors."""
    import learner.tokenizer as tokenizer
    from learner.model import io as model_io
    from learner.model import safetensors_io

    path = Path(args.model)
    try:
        model, facts = model_io.load(path, dtype=args.dtype, mesh=_mesh(args.mesh))
    except (model_io.ModelFormatError, safetensors_io.SafetensorsError) as err:
        raise _usage(str(err)) from None
    tok = tokenizer.load_tokenizer(path) if tokenizer.has_tokenizer(path) else None
    generation = path / "generation_config.json"
    configs = [facts["hf_config"]] + (
        [model_io.read_json(generation)] if generation.is_file() else []
    )
    return model, facts, tok, tokenizer.eos_token_ids(tok, *configs)


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise _usage(f"{path}: {err.strerror or err}") from None


# --------------------------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------------------------


def _import(args: argparse.Namespace) -> int:
    from learner.model import io as model_io

    try:
        model = model_io.import_hf(
            Path(args.hf_dir),
            Path(args.out_dir),
            param_dtype=args.param_dtype,
            overwrite=args.force,
        )
    except model_io.ModelFormatError as err:
        raise _usage(str(err)) from None
    cfg = model.config
    print(
        f"imported {args.hf_dir} -> {args.out_dir} ({cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.param_dtype})"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from learner.model import io as model_io

    try:
        files = model_io.export_hf(
            Path(args.model_dir),
            Path(args.hf_dir),
            dtype=args.dtype,
            max_shard_bytes=_size(args.max_shard_size),
        )
    except model_io.ModelFormatError as err:
        raise _usage(str(err)) from None
    print(
        f"exported {args.model_dir} -> {args.hf_dir} ({len(files)} safetensors file{'s' * (len(files) > 1)})"
    )
    return 0


def _init(args: argparse.Namespace) -> int:
    import learner.tokenizer as tokenizer
    from learner.model import io as model_io
    from learner.model import qwen2

    if args.config:
        hf_config = model_io.read_json(Path(args.config)) if Path(args.config).is_file() else None
        if hf_config is None:
            raise _usage(f"{args.config}: no such file")
    else:
        hf_config = dict(qwen2.PRESETS[args.preset])
    if args.tokenizer:
        if not tokenizer.has_tokenizer(Path(args.tokenizer)):
            raise _usage(f"{args.tokenizer}: no tokenizer.json")
        tok = tokenizer.load_tokenizer(Path(args.tokenizer))
        hf_config["vocab_size"] = -(-len(tok) // 64) * 64
        hf_config["eos_token_id"] = tok.eos_token_id
    if args.vocab_size:
        hf_config["vocab_size"] = args.vocab_size
    try:
        model_io.init_model_dir(
            Path(args.out_dir),
            hf_config,
            param_dtype=args.param_dtype,
            seed=args.seed,
            tokenizer_dir=Path(args.tokenizer) if args.tokenizer else None,
            overwrite=args.force,
        )
    except model_io.ModelFormatError as err:
        raise _usage(str(err)) from None
    print(f"initialised {args.out_dir} (vocab {hf_config['vocab_size']}, {args.param_dtype})")
    return 0


def _score(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from learner.model import logprobs

    model, _, tok, _ = _load(args)
    if args.token_ids is not None:
        ids = _token_ids(args.token_ids)
    else:
        if tok is None:
            raise _usage(f"{args.model} has no tokenizer.json; pass --token-ids instead")
        ids = list(tok.encode(_read_text(args.text_file), add_special_tokens=False))
    if len(ids) < 2:
        raise _usage("need at least two tokens to score")
    if max(ids) >= model.config.vocab_size:
        raise _usage(f"token id {max(ids)} is outside the vocabulary of {model.config.vocab_size}")
    graphdef, state = nnx.split(model)
    score = jax.jit(lambda s, t: logprobs.next_token_logprobs(nnx.merge(graphdef, s), t))
    values = np.asarray(score(state, jnp.asarray([ids], dtype=jnp.int32))[0]).tolist()
    result = {
        "tokens": ids,
        "logprobs": values,
        "sum": float(sum(values)),
        "mean": float(np.mean(values)),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for token, value in zip(ids[1:], values, strict=True):
            piece = repr(tok.decode([token])) if tok is not None else ""
            print(f"{token:>8} {value:>12.5f} {piece}")
        print(f"sum {result['sum']:.5f}  mean {result['mean']:.5f}  ({len(values)} tokens)")
    return 0


def _sample(args: argparse.Namespace) -> int:
    from learner.generate import sampler

    if args.num_samples < 1 or args.max_new_tokens < 1:
        raise _usage("--num-samples and --max-new-tokens must be at least 1")
    model, _, tok, eos = _load(args)
    if args.token_ids:
        prompts: list[Any] = [_token_ids(t) for t in args.token_ids]
        if max(max(p) for p in prompts) >= model.config.vocab_size:
            raise _usage(f"a token id is outside the vocabulary of {model.config.vocab_size}")
    else:
        if tok is None:
            raise _usage(f"{args.model} has no tokenizer.json; pass --token-ids instead")
        prompts = [_read_text(f) for f in args.prompt_file]
    prompts = [p for p in prompts for _ in range(args.num_samples)]
    if args.no_stop:
        stop: list[str] = []
    elif args.stop:
        stop = args.stop
    else:
        stop = list(sampler.DEFAULT_STOP) if tok is not None else []
    if stop and tok is None:
        raise _usage("--stop needs a model with a tokenizer")
    try:
        params = sampler.SamplingParams(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
    except ValueError as err:
        raise _usage(str(err)) from None
    engine = sampler.Sampler(
        model, tok, eos_ids=eos, mesh=_mesh(args.mesh), decode_kernels=args.decode_kernels
    )
    results = engine.generate(prompts, params, stop=stop)
    if args.json:
        print(
            json.dumps(
                {
                    "samples": [
                        {"prompt_index": i // args.num_samples, **r.to_json()}
                        for i, r in enumerate(results)
                    ]
                }
            )
        )
    else:
        for i, r in enumerate(results):
            print(
                f"--- sample {i} ({len(r.tokens)} tokens, {r.finish_reason}, logprob {sum(r.logprobs):.3f})"
            )
            print(r.text if r.text is not None else ",".join(map(str, r.tokens)))
    return 0


def _train_tokenizer(args: argparse.Namespace) -> int:
    import learner.tokenizer as tokenizer

    missing = [p for p in args.inputs if not Path(p).exists()]
    if missing:
        raise _usage(f"{missing[0]}: no such file or directory")
    try:
        tok = tokenizer.train_and_save(
            [Path(p) for p in args.inputs],
            Path(args.out),
            vocab_size=args.vocab_size,
            min_frequency=args.min_frequency,
        )
    except ValueError as err:
        raise _usage(str(err)) from None
    print(f"trained a {len(tok)}-token BPE -> {args.out}")
    return 0


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory (or an HF checkpoint directory)")
    p.add_argument(
        "--dtype", choices=DTYPE_CHOICES, help="compute dtype (default: the parameters')"
    )
    p.add_argument("--mesh", metavar="FSDPxTP", help="shard over a device mesh, e.g. 4x2")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `model`, `tokenizer` and `sample` to the top-level parser."""
    model = subparsers.add_parser("model", help="import, export, create and score policy models")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    p = model_sub.add_parser("import", help="HF safetensors checkpoint -> model directory")
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    p.add_argument("--param-dtype", choices=DTYPE_CHOICES, help="cast parameters (default: keep)")
    p.add_argument("--force", action="store_true", help="replace an existing model directory")
    p.set_defaults(handler=_import)

    p = model_sub.add_parser("export", help="model directory -> HF safetensors checkpoint")
    p.add_argument("model_dir")
    p.add_argument("hf_dir")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="cast parameters (default: keep)")
    p.add_argument(
        "--max-shard-size", default="5GiB", help="split files above this size (default 5GiB)"
    )
    p.set_defaults(handler=_export)

    p = model_sub.add_parser("init", help="a randomly initialised model directory")
    p.add_argument("out_dir")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--preset", default="tiny", choices=["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"]
    )
    source.add_argument("--config", help="an HF config.json")
    p.add_argument("--tokenizer", help="tokenizer directory to copy (sets vocab size and EOS)")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--param-dtype", choices=DTYPE_CHOICES, default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true")
    p.set_defaults(handler=_init)

    p = model_sub.add_parser("score", help="per-token log-probabilities of a text")
    _model_options(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text-file")
    src.add_argument("--token-ids", help="comma-separated token ids")
    p.set_defaults(handler=_score)

    tok = subparsers.add_parser("tokenizer", help="train a small BPE tokenizer")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)
    p = tok_sub.add_parser("train", help="byte-level BPE from programs and kernels (JSONL or text)")
    p.add_argument(
        "inputs",
        nargs="+",
        help="JSONL files (source/completion fields), text files or directories",
    )
    p.add_argument("--out", required=True, help="output tokenizer directory")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--min-frequency", type=int, default=2)
    p.set_defaults(handler=_train_tokenizer)

    p = subparsers.add_parser("sample", help="sample completions from a model")
    _model_options(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-file", action="append", help="a text prompt (repeat for a batch)")
    src.add_argument("--token-ids", action="append", help="comma-separated prompt ids (repeatable)")
    p.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stop", action="append", help="stop string (repeatable; default </triton_code>)"
    )
    p.add_argument("--no-stop", action="store_true", help="stop only at EOS or the token limit")
    p.add_argument(
        "--decode-kernels",
        # learner.generate.decode.DECODE_KERNELS (no jax import here)
        choices=("auto", "xla", "pallas"),
        default="auto",
        help="decode step kernels: XLA's fusions, hand-written Pallas ones (one device, <= 8 "
        "rows), or auto (Pallas on a GPU at 1-2 rows, where they are faster)",
    )
    p.set_defaults(handler=_sample)
