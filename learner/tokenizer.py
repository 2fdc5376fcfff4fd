"""Tokenizers: any Hugging Face tokenizer directory, or a small byte-level BPE of our own.

The small BPE is trained on the project's generated programs and kernels so the offline demo
needs nothing downloaded. It knows `<triton_code>` / `</triton_code>` (which fence a kernel in a
completion) and `<|endoftext|>` (EOS and padding) as single special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"
CODE_OPEN = "<triton_code>"
CODE_CLOSE = "</triton_code>"
SPECIAL_TOKENS = (EOS, CODE_OPEN, CODE_CLOSE)
TEXT_SUFFIXES = (".txt", ".py", ".md")


def has_tokenizer(directory: Path) -> bool:
    return (Path(directory) / "tokenizer.json").is_file()


def load_tokenizer(directory: Path) -> Any:
    """The HF fast tokenizer of a local directory (never the network).

    Reads `tokenizer.json` (+ `tokenizer_config.json`) through `PreTrainedTokenizerFast`, which
    every Qwen tokenizer is; `AutoTokenizer` would import torch through the config classes.
    """
    from transformers import PreTrainedTokenizerFast

    if not has_tokenizer(directory):
        raise FileNotFoundError(f"{directory}: no tokenizer.json")
    return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)


def eos_token_ids(tokenizer: Any, *configs: Mapping[str, Any]) -> list[int]:
    """Every EOS id the tokenizer and the configs (config.json, generation_config.json) name."""
    ids: list[int] = []
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    for config in configs:
        value = config.get("eos_token_id")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)
    return ids


def iter_texts(paths: Sequence[Path]) -> Iterator[str]:
    """Training text: JSONL records' `source` and `completion` fields, or whole text files.

    Directories are searched recursively for `*.jsonl` and text files.
    """
    for path in paths:
        path = Path(path)
        if path.is_dir():
            children = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in (".jsonl", *TEXT_SUFFIXES)
            )
            yield from iter_texts(children)
        elif path.suffix == ".jsonl":
            with open(path) as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
                    for key in ("source", "completion"):
                        if isinstance(record.get(key), str):
                            yield record[key]
        else:
            yield path.read_text(errors="replace")


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> Any:
    """A byte-level BPE (HF fast tokenizer) with the special tokens above; EOS also pads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[CODE_OPEN, CODE_CLOSE],
    )


def train_and_save(
    inputs: Sequence[Path], out_dir: Path, *, vocab_size: int = 4096, min_frequency: int = 2
) -> Any:
    """Train on `inputs` (see `iter_texts`) and save an HF tokenizer directory."""
    texts = list(iter_texts(inputs))
    if not any(t.strip() for t in texts):
        raise ValueError("no training text found in the inputs")
    tokenizer = train_bpe(texts, vocab_size=vocab_size, min_frequency=min_frequency)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer
