"""Model directories: import from and export to Hugging Face checkpoints, save and load.

A model directory (what `drtriton model import` writes and every other command reads) holds:

    drtriton_model.json   {"format": "drtriton-model", "version": 1, "architecture": "qwen2",
                           "param_dtype": ..., "hf_lm_head_tied_copy": bool}
    config.json           the Hugging Face config, verbatim
    params/               an orbax checkpoint (StandardCheckpointer) of the parameters, a nested
                          dict keyed by this package's parameter paths
    tokenizer files       copied as they were (tokenizer.json, ..., generation_config.json)

Orbax restores straight into sharded arrays on any mesh, on one host or many, and it is the
format of the training checkpoints too. An HF directory works wherever a model directory does
(it is converted on the fly); export writes the HF layout back, tensor for tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from learner.model import qwen2
from learner.model import safetensors_io as st
from learner.model.params import HF_IGNORED, HF_MAPPING, PARTITION_RULES, hf_dtype_name
from learner.sharding import param_sharding

FORMAT_FILE = "drtriton_model.json"
FORMAT_NAME = "drtriton-model"
FORMAT_VERSION = 1
PARAMS_DIR = "params"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)


class ModelFormatError(ValueError):
    """A directory that is not a usable model: missing files, unknown or missing tensors."""


# --------------------------------------------------------------------------------------------
# Parameter paths and layouts
# --------------------------------------------------------------------------------------------


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _undotted(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in name.split("."))


def flat_params(model: nnx.Module) -> dict[str, Any]:
    """{dotted path: array} for every parameter (arrays or ShapeDtypeStructs)."""
    return {
        _dotted(path): var.get_value()
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }


def with_params(model: nnx.Module, params: Mapping[str, Any]) -> nnx.Module:
    """A model of `model`'s structure holding `params` (which must name every parameter)."""
    graphdef, state = nnx.split(model)
    flat = nnx.to_flat_state(state)
    names = {_dotted(path) for path, _ in flat}
    if names != set(params):
        raise ModelFormatError(f"parameter sets differ: {sorted(names ^ set(params))[:5]}")
    pure: dict[Any, Any] = {}
    for name, value in params.items():
        node = pure
        *parents, leaf = _undotted(name)
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def _to_model_layout(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """An HF tensor in this package's layout (a view where numpy allows one)."""
    if kind == "none":
        return x
    if kind == "transpose":
        return x.T
    if kind == "heads_in":  # [heads*hd, hidden] -> [hidden, heads, hd]
        return x.T.reshape(shape)
    if kind == "heads_bias":  # [heads*hd] -> [heads, hd]
        return x.reshape(shape)
    if kind == "heads_out":  # [hidden, heads*hd] -> [heads, hd, hidden]
        return x.T.reshape(shape)
    raise ValueError(f"unknown layout change {kind!r}")


def _to_hf_layout(kind: str, x: np.ndarray) -> np.ndarray:
    """Inverse of `_to_model_layout`, contiguous."""
    if kind == "none":
        out = x
    elif kind == "transpose":
        out = x.T
    elif kind == "heads_in":
        out = x.reshape(x.shape[0], -1).T
    elif kind == "heads_bias":
        out = x.reshape(-1)
    elif kind == "heads_out":
        out = x.reshape(-1, x.shape[-1]).T
    else:
        raise ValueError(f"unknown layout change {kind!r}")
    return np.ascontiguousarray(out)


def hf_key_table(cfg: qwen2.Qwen2Config) -> dict[str, tuple[str, str]]:
    """{HF tensor name: (parameter path, layout change)} for this config."""
    table: dict[str, tuple[str, str]] = {}
    for hf_key, path, kind in HF_MAPPING:
        if path.startswith("lm_head") and cfg.tie_word_embeddings:
            continue
        layers = range(cfg.num_layers) if "{i}" in hf_key else [None]
        for i in layers:
            table[hf_key.format(i=i)] = (path.format(i=i), kind)
    return table


def _describe_keys(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    return shown + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------


def _placement(
    mesh: Mesh | None, device: jax.Device | None = None
) -> Callable[[str, tuple[int, ...]], jax.sharding.Sharding]:
    if mesh is None:
        single = SingleDeviceSharding(device or jax.devices()[0])
        return lambda _path, _shape: single
    return lambda path, shape: param_sharding(path, shape, PARTITION_RULES, mesh)


def _place(view: np.ndarray, dtype: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """Put a (memory-mapped) host array on devices, reading only each device's slice."""
    if isinstance(sharding, NamedSharding):
        return jax.make_array_from_callback(
            view.shape, sharding, lambda idx: np.asarray(view[idx], dtype=dtype)
        )
    return jax.device_put(np.asarray(view, dtype=dtype), sharding)


def _config(hf_config: Mapping[str, Any], **overrides: Any) -> qwen2.Qwen2Config:
    try:
        return qwen2.Qwen2Config.from_hf(hf_config, **overrides)
    except (KeyError, ValueError, TypeError) as err:
        raise ModelFormatError(f"unsupported config.json: {err}") from err


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise ModelFormatError(f"{path} not found") from err
    except json.JSONDecodeError as err:
        raise ModelFormatError(f"{path}: invalid JSON ({err})") from err


# --------------------------------------------------------------------------------------------
# Hugging Face checkpoints
# --------------------------------------------------------------------------------------------


def _check_dir(path: Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ModelFormatError(f"{path}: no such directory")
    return path


def load_hf(
    hf_dir: Path,
    *,
    param_dtype: str | None = None,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    **overrides: Any,
) -> tuple[qwen2.Qwen2, dict[str, Any]]:
    """A model from an HF checkpoint directory, and facts export needs to write it back.

    `param_dtype` defaults to the tensors' own dtype (so a round trip is exact); `dtype` (the
    compute dtype) defaults to `param_dtype`. Unknown, missing or misshapen tensors raise.
    """
    hf_dir = _check_dir(hf_dir)
    hf_config = read_json(hf_dir / "config.json")
    try:
        tensors = st.index_dir(hf_dir)
    except st.SafetensorsError as err:
        raise ModelFormatError(str(err)) from err
    if param_dtype is None:
        dtypes = {
            str(info.dtype) for name, info in tensors.items() if name.endswith(("weight", "bias"))
        }
        declared = hf_dtype_name(hf_config)
        param_dtype = dtypes.pop() if len(dtypes) == 1 else (declared or "float32")
        if param_dtype not in qwen2.DTYPES:
            raise ModelFormatError(f"checkpoint dtype {param_dtype} is not supported")
    cfg = _config(hf_config, param_dtype=param_dtype, dtype=dtype or param_dtype, **overrides)
    table = hf_key_table(cfg)

    reader = st.TensorReader()
    ignored = [k for k in tensors if any(re.fullmatch(p, k) for p in HF_IGNORED)]
    tied_copy = False
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        head = reader.get(tensors["lm_head.weight"])
        embed_info = tensors.get("model.embed_tokens.weight")
        if embed_info is None or not np.array_equal(head, reader.get(embed_info)):
            raise ModelFormatError(
                f"{hf_dir}: lm_head.weight differs from model.embed_tokens.weight although tie_word_embeddings is true"
            )
        ignored.append("lm_head.weight")
        tied_copy = True
    unknown = sorted(set(tensors) - set(table) - set(ignored))
    if unknown:
        raise ModelFormatError(f"{hf_dir}: unknown tensors {_describe_keys(unknown)}")
    missing = sorted(set(table) - set(tensors))
    if missing:
        raise ModelFormatError(f"{hf_dir}: missing tensors {_describe_keys(missing)}")

    skeleton = qwen2.abstract(cfg)
    shapes = {path: tuple(x.shape) for path, x in flat_params(skeleton).items()}
    place = _placement(mesh)
    params: dict[str, jax.Array] = {}
    for hf_key, (path, kind) in table.items():
        info = tensors[hf_key]
        try:
            view = _to_model_layout(kind, reader.get(info), shapes[path])
        except ValueError:
            view = None
        if view is None or view.shape != shapes[path]:
            raise ModelFormatError(
                f"{hf_dir}: tensor {hf_key} has shape {list(info.shape)}, which does not fit the config"
            )
        params[path] = _place(view, cfg.weight_dtype, place(path, shapes[path]))
    facts = {"hf_config": hf_config, "hf_lm_head_tied_copy": tied_copy}
    return with_params(skeleton, params), facts


def hf_tensors(
    model: qwen2.Qwen2, *, tied_copy: bool = False, dtype: str | None = None
) -> dict[str, np.ndarray]:
    """The model's parameters as HF-named host arrays in HF layout."""
    cfg: qwen2.Qwen2Config = model.config
    table = hf_key_table(cfg)
    params = flat_params(model)
    cast = qwen2.DTYPES[dtype] if dtype else None
    out: dict[str, np.ndarray] = {}
    for hf_key, (path, kind) in table.items():
        host = np.asarray(jax.device_get(params[path]))
        if cast is not None:
            host = host.astype(cast)
        out[hf_key] = _to_hf_layout(kind, host)
    if tied_copy and cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# --------------------------------------------------------------------------------------------
# Model directories
# --------------------------------------------------------------------------------------------


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _unnest(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_unnest(value, name + "."))
        else:
            flat[name] = value
    return flat


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy whichever tokenizer and generation files `src` has; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


def save_model(
    model: qwen2.Qwen2,
    out_dir: Path,
    *,
    hf_config: Mapping[str, Any] | None = None,
    hf_lm_head_tied_copy: bool = False,
    overwrite: bool = False,
) -> None:
    """Write a model directory (see the module docstring). Works from any mesh and host count."""
    import orbax.checkpoint as ocp

    out_dir = Path(out_dir).absolute()
    if (out_dir / PARAMS_DIR).exists():
        if not overwrite:
            raise ModelFormatError(f"{out_dir} already holds a model")
        shutil.rmtree(out_dir / PARAMS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg: qwen2.Qwen2Config = model.config
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out_dir / PARAMS_DIR, _nest(flat_params(model)))
    checkpointer.wait_until_finished()
    checkpointer.close()
    if jax.process_index() == 0:
        config = dict(hf_config) if hf_config is not None else cfg.to_hf()
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "architecture": qwen2.ARCHITECTURE,
            "param_dtype": cfg.param_dtype,
            "hf_lm_head_tied_copy": hf_lm_head_tied_copy,
        }
        (out_dir / FORMAT_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def is_model_dir(path: Path) -> bool:
    return (Path(path) / FORMAT_FILE).is_file()


def read_meta(model_dir: Path) -> dict[str, Any]:
    meta = read_json(Path(model_dir) / FORMAT_FILE)
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ModelFormatError(f"{model_dir}: not a {FORMAT_NAME} v{FORMAT_VERSION} directory")
    if meta.get("architecture") != qwen2.ARCHITECTURE:
        raise ModelFormatError(
            f"{model_dir}: architecture {meta.get('architecture')!r} is not supported"
        )
    return meta


def load_model_dir(
    model_dir: Path,
    *,
    param_dtype: str | None = None,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    device: jax.Device | None = None,
    **overrides: Any,
) -> tuple[qwen2.Qwen2, dict[str, Any]]:
    """A model from a model directory, restored directly into `mesh`'s shardings."""
    import orbax.checkpoint as ocp

    model_dir = _check_dir(model_dir).absolute()
    meta = read_meta(model_dir)
    hf_config = read_json(model_dir / "config.json")
    stored = meta["param_dtype"]
    param_dtype = param_dtype or stored
    cfg = _config(hf_config, param_dtype=stored, dtype=dtype or param_dtype, **overrides)
    skeleton = qwen2.abstract(cfg)
    place = _placement(mesh, device)
    target = {
        path: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=place(path, tuple(x.shape)))
        for path, x in flat_params(skeleton).items()
    }
    checkpointer = ocp.StandardCheckpointer()
    try:
        restored = _unnest(checkpointer.restore(model_dir / PARAMS_DIR, _nest(target)))
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise ModelFormatError(f"{model_dir}: cannot restore parameters ({err})") from err
    finally:
        checkpointer.close()
    model = with_params(skeleton, restored)
    if param_dtype != stored:
        model = cast_params(model, param_dtype)
    facts = {"hf_config": hf_config, "hf_lm_head_tied_copy": bool(meta.get("hf_lm_head_tied_copy"))}
    return model, facts


def cast_params(model: qwen2.Qwen2, param_dtype: str) -> qwen2.Qwen2:
    """The same model with parameters stored in `param_dtype` (shardings kept)."""
    cfg = model.config
    new_cfg = dataclasses.replace(cfg, param_dtype=param_dtype)
    dtype = qwen2.DTYPES[param_dtype]
    params = {k: v.astype(dtype) for k, v in flat_params(model).items()}
    return with_params(qwen2.abstract(new_cfg), params)


def load(
    path: Path,
    *,
    param_dtype: str | None = None,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    **overrides: Any,
) -> tuple[qwen2.Qwen2, dict[str, Any]]:
    """A model from a model directory or straight from an HF checkpoint directory."""
    path = _check_dir(path)
    loader = load_model_dir if is_model_dir(path) else load_hf
    return loader(path, param_dtype=param_dtype, dtype=dtype, mesh=mesh, **overrides)


def import_hf(
    hf_dir: Path, out_dir: Path, *, param_dtype: str | None = None, overwrite: bool = False
) -> qwen2.Qwen2:
    """HF checkpoint directory -> model directory (tokenizer files copied along)."""
    model, facts = load_hf(hf_dir, param_dtype=param_dtype)
    hf_config = dict(facts["hf_config"])
    if param_dtype is not None:
        hf_config["torch_dtype"] = param_dtype
        hf_config.pop("dtype", None)
    save_model(
        model,
        out_dir,
        hf_config=hf_config,
        hf_lm_head_tied_copy=facts["hf_lm_head_tied_copy"],
        overwrite=overwrite,
    )
    copy_tokenizer_files(Path(hf_dir), Path(out_dir))
    return model


def export_hf(
    model_dir: Path,
    hf_dir: Path,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> list[str]:
    """Model directory -> HF checkpoint directory (safetensors, config, tokenizer files)."""
    model_dir = _check_dir(model_dir)
    meta = read_meta(model_dir)
    model, facts = load_model_dir(model_dir, device=jax.devices("cpu")[0])
    tensors = hf_tensors(model, tied_copy=meta.get("hf_lm_head_tied_copy", False), dtype=dtype)
    hf_dir = Path(hf_dir)
    hf_dir.mkdir(parents=True, exist_ok=True)
    files = st.write_checkpoint(
        hf_dir, tensors, max_shard_bytes=max_shard_bytes, metadata={"format": "pt"}
    )
    hf_config = dict(facts["hf_config"])
    if dtype is not None:
        hf_config["torch_dtype"] = dtype
        hf_config.pop("dtype", None)
    (hf_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    copy_tokenizer_files(model_dir, hf_dir)
    return files


def init_model_dir(
    out_dir: Path,
    hf_config: Mapping[str, Any],
    *,
    param_dtype: str = "float32",
    seed: int = 0,
    tokenizer_dir: Path | None = None,
    overwrite: bool = False,
) -> qwen2.Qwen2:
    """A freshly initialised model directory (for offline demos and benchmarks)."""
    cfg = _config(hf_config, param_dtype=param_dtype, dtype=param_dtype)
    model = random_model(cfg, seed=seed)
    config = {
        **cfg.to_hf(),
        **{k: v for k, v in hf_config.items() if k not in ("torch_dtype", "dtype")},
    }
    config["torch_dtype"] = param_dtype
    save_model(model, out_dir, hf_config=config, overwrite=overwrite)
    if tokenizer_dir is not None:
        copy_tokenizer_files(Path(tokenizer_dir), Path(out_dir))
    return model


@functools.cache
def _initializer(
    kind: str, shape: tuple[int, ...], dtype: Any, sharding: jax.sharding.Sharding
) -> Callable[[jax.Array], jax.Array]:
    """A jitted draw of one parameter, compiled once per (kind, shape, dtype, sharding)."""

    def init(key: jax.Array) -> jax.Array:
        if kind == "normal":
            return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
        return jnp.full(shape, 1.0 if kind == "ones" else 0.0, dtype)

    return jax.jit(init, out_shardings=sharding)


def _init_kind(path: str) -> str:
    return "ones" if path.endswith(".scale") else "zeros" if path.endswith(".bias") else "normal"


def random_model(
    cfg: qwen2.Qwen2Config, *, seed: int = 0, mesh: Mesh | None = None, on_host: bool | None = None
) -> qwen2.Qwen2:
    """A model with normal(0, 0.02) weights, zero biases and unit norm scales.

    On CPU (`on_host`, the default there) numpy draws the weights: no compile at all. On
    accelerators each parameter is drawn on its devices, already sharded, by a jitted
    initialiser compiled once per distinct shape. The two paths give different numbers.
    """
    skeleton = qwen2.abstract(cfg)
    place = _placement(mesh)
    if on_host is None:
        on_host = jax.devices()[0].platform == "cpu"
    rng = np.random.default_rng(seed)
    root = jax.random.key(seed)
    params = {}
    for i, (path, x) in enumerate(sorted(flat_params(skeleton).items())):
        shape, kind, sharding = tuple(x.shape), _init_kind(path), place(path, tuple(x.shape))
        if on_host:
            if kind == "normal":
                host = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            else:
                host = np.full(shape, 1.0 if kind == "ones" else 0.0, np.float32)
            params[path] = _place(host, x.dtype, sharding)
        else:
            params[path] = _initializer(kind, shape, x.dtype, sharding)(jax.random.fold_in(root, i))
    return with_params(skeleton, params)
