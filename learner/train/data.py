"""What every training data source shares: JSONL reading, program ids, the held-out split,
the tokenizer.

The held-out split depends on a program's id alone (a hash, no state, no file order), so
SFT pairs and RL prompts of one program always fall on the same side, and a split never
changes when files grow or are reordered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from learner import tokenizer as tokenizers

Split = Literal["train", "held_out", "all"]
SPLITS: tuple[Split, ...] = ("train", "held_out", "all")


class DataError(ValueError):
    """Training data that cannot be used as given (the message says where and why)."""


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line; a file that is missing, empty or has a
    line that is not a JSON object is a `DataError` naming `file:line`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    seen = 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{number}: a record must be a JSON object")
            seen += 1
            yield number, record
    if not seen:
        raise DataError(f"{path}: empty file (no records)")


def require(record: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """`record[key]`, which must be a `kind`; otherwise a `DataError` at `where`."""
    value = record.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = {str: "a string", int: "an integer"}.get(kind, kind.__name__)
        raise DataError(f"{where}: `{key}` must be {name}, got {value!r:.60}")
    return value


@dataclass(frozen=True)
class HeldOut:
    """A program is held out when sha256(salt + program_id) falls in the first `fraction`."""

    fraction: float = 0.05
    salt: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise DataError(f"held-out fraction must be in [0, 1], got {self.fraction}")

    def contains(self, program_id: str) -> bool:
        digest = hashlib.sha256(f"{self.salt}{program_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < self.fraction * 2**64

    def keeps(self, program_id: str, split: Split) -> bool:
        """Whether a program belongs to `split`."""
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r} (one of {', '.join(SPLITS)})")
        return split == "all" or (split == "held_out") == self.contains(program_id)


def open_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as given, or the HF tokenizer of a directory (a clear error when the
    directory or its tokenizer.json is missing)."""
    if not isinstance(tokenizer, str | Path):
        return tokenizer
    directory = Path(tokenizer)
    if not directory.is_dir():
        raise DataError(f"{directory}: tokenizer directory not found")
    if not tokenizers.has_tokenizer(directory):
        raise DataError(f"{directory}: not a tokenizer directory (no tokenizer.json)")
    return tokenizers.load_tokenizer(directory)


def eos_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no EOS token")
    return int(tokenizer.eos_token_id)


def pad_id(tokenizer: Any) -> int:
    """The padding id: the tokenizer's pad token, else its EOS (never a loss target)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else eos_id(tokenizer)


def encode(tokenizer: Any, texts: Sequence[str], chunk: int = 1024) -> list[np.ndarray]:
    """Token ids of each text (no special tokens added), as int32 arrays, in chunks."""
    out: list[np.ndarray] = []
    for start in range(0, len(texts), chunk):
        ids = tokenizer(list(texts[start : start + chunk]), add_special_tokens=False)["input_ids"]
        out.extend(np.asarray(row, dtype=np.int32) for row in ids)
    return out


def fingerprint(*parts: Any) -> str:
    """A short hash naming a dataset's content, checked when a data position is restored."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            digest.update(str(part.dtype).encode() + np.ascontiguousarray(part).tobytes())
        else:
            digest.update(json.dumps(part, sort_keys=True).encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:16]
