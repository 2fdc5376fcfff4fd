"""Small teacher-pairs and program files, and a BPE trained on their kind of text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from learner.tokenizer import train_bpe
from synth.teacher.prompt import build_completion, build_prompt

OPS = ("relu", "sigmoid", "tanh", "exp", "abs")


def problem_source(index: int) -> str:
    op = OPS[index % len(OPS)]
    lines = [f"    tensor_{k + 1} = torch.{op}(tensor_{k})" for k in range(1 + index % 4)]
    return (
        "import torch\n\n\ndef get_inputs():\n"
        f"    return [torch.randn([{4 + index}, 8], dtype=torch.float32)]\n\n\n"
        "def fused_operator(tensor_0):\n"
        + "\n".join(lines)
        + f"\n    return [tensor_{len(lines)}]\n"
    )


def kernel_code(index: int) -> str:
    body = "\n".join(f"    x = tl.{OPS[(index + k) % len(OPS)]}(x)" for k in range(1 + index % 6))
    return (
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def kernel_{index}(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    x = tl.load(x_ptr + offs, mask=offs < n)\n"
        f"{body}\n    tl.store(out_ptr + offs, x, mask=offs < n)\n"
    )


def pair_record(
    index: int, *, verdict: str = "correct", level: int | None = None
) -> dict[str, Any]:
    """A line as `drtriton teacher build` writes it; a short prompt keeps rows small."""
    source = problem_source(index)
    return {
        "program_id": f"prog{index:04d}",
        "level": level if level is not None else 1 + index % 2,
        "ops": [OPS[index % len(OPS)]],
        "prompt": f"Rewrite as Triton:\n{source}",
        "completion": build_completion(kernel_code(index)),
        "verdict": verdict,
        "errors": [],
        "problem": source,
    }


def program_record(index: int, level: int) -> dict[str, Any]:
    """A line as `drtriton synth generate` writes it (the fields the learner reads)."""
    return {
        "id": f"prog{index:04d}",
        "level": level,
        "ops": [OPS[index % len(OPS)]],
        "source": problem_source(index),
    }


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    texts = [build_prompt(problem_source(i)) for i in range(4)]
    texts += [pair_record(i)["prompt"] + pair_record(i)["completion"] for i in range(12)]
    return train_bpe(texts * 2, vocab_size=600)


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    records = [pair_record(i) for i in range(40)]
    records[3]["verdict"] = "incorrect"
    records[7]["verdict"] = "compile_error"
    records[11]["verdict"] = "incorrect"
    return write_jsonl(tmp_path / "pairs.jsonl", records)
