"""Read and write the safetensors format with numpy alone (bfloat16 through ml_dtypes).

Reading memory-maps each file and returns views, so a sharded loader touches only the bytes of
the slices it needs, and a multi-host load reads each weight shard once per host. The format:
8 bytes little-endian header length, a JSON header {name: {dtype, shape, data_offsets}} plus an
optional "__metadata__" of strings, padded with spaces, then the raw little-endian data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A file or directory that is not a readable safetensors checkpoint."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes live."""

    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in `file`
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors of one file (by name) and its `__metadata__`."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SafetensorsError(f"{path}: not a safetensors file ({err})") from err
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + length
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        code = entry.get("dtype")
        if code not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {code}")
        begin, end = entry["data_offsets"]
        infos[name] = TensorInfo(
            path, _DTYPES[code], tuple(entry["shape"]), base + begin, base + end
        )
    return infos, metadata


def index_dir(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint directory: `model.safetensors` or a sharded index."""
    directory = Path(directory)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SafetensorsError(f"{index_path}: malformed index ({err})") from err
        infos: dict[str, TensorInfo] = {}
        for filename in sorted(set(weight_map.values())):
            file_infos, _ = read_header(directory / filename)
            for name, info in file_infos.items():
                if weight_map.get(name) != filename:
                    raise SafetensorsError(
                        f"{filename} holds {name}, which the index does not place there"
                    )
                infos[name] = info
        missing = sorted(set(weight_map) - set(infos))
        if missing:
            raise SafetensorsError(
                f"{index_path}: indexed tensors absent from their files: {missing[:5]}"
            )
        return infos
    if (directory / SINGLE_FILE).is_file():
        return read_header(directory / SINGLE_FILE)[0]
    raise SafetensorsError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


class TensorReader:
    """Opens each file once (memory-mapped) and hands out read-only array views."""

    def __init__(self) -> None:
        self._maps: dict[Path, np.memmap] = {}

    def get(self, info: TensorInfo) -> np.ndarray:
        if info.end == info.start:
            return np.zeros(info.shape, info.dtype)
        if info.file not in self._maps:
            self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        raw = self._maps[info.file][info.start : info.end]
        return raw.view(info.dtype).reshape(info.shape)


def _header_bytes(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[str]]:
    # Largest element size first, as the reference writer does, so every tensor is aligned.
    names = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in names:
        arr = tensors[name]
        if arr.dtype not in _CODES:
            raise SafetensorsError(f"tensor {name}: dtype {arr.dtype} has no safetensors code")
        header[name] = {
            "dtype": _CODES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, names


def write_file(
    path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write `tensors` to one safetensors file."""
    header, names = _header_bytes(tensors, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name in names:
            arr = np.ascontiguousarray(tensors[name])
            if arr.size:
                f.write(arr.reshape(-1).view(np.uint8).data)


def write_checkpoint(
    directory: Path,
    tensors: Mapping[str, np.ndarray],
    *,
    max_shard_bytes: int = 5 * 2**30,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Write a checkpoint directory: one file if it fits `max_shard_bytes`, else shards + index."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    total = sum(int(a.nbytes) for a in tensors.values())
    if total <= max_shard_bytes:
        write_file(directory / SINGLE_FILE, tensors, metadata)
        return [SINGLE_FILE]
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        nbytes = int(tensors[name].nbytes)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    for filename, names in zip(files, shards, strict=True):
        write_file(directory / filename, {n: tensors[n] for n in names}, metadata)
        weight_map.update(dict.fromkeys(names, filename))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return files
