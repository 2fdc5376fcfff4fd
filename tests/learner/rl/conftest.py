"""Level-1 programs and short kernels for them: the data of the RL end-to-end tests.

The SFT pairs teach one short kernel per operator; every other pair's kernel negates its
result (a wrong answer the teacher would never give), so the SFT'd policy is right about
half the time and RL has something to learn within a few steps: never negate.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from synth.teacher.prompt import build_completion, build_prompt

REPO_ROOT = Path(__file__).resolve().parents[3]
SFT_STEPS = 150

OPS = {
    "relu": "tl.maximum(tl.load(x + i, mask=m), 0.0)",
    "sigmoid": "tl.sigmoid(tl.load(x + i, mask=m))",
}

KERNEL = """import torch
import triton
import triton.language as tl


@triton.jit
def k(x, y, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    tl.store(y + i, {value}, mask=m)


def triton_fused_operator(tensor_0):
    x = tensor_0.contiguous()
    y = torch.empty_like(x)
    k[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), B=256)
    return [y]
"""


def program_source(op: str, shape: list[int]) -> str:
    """A level-1 program in `drtriton synth generate`'s format."""
    return (
        "import torch\nimport torch.nn.functional as F\n\ndef get_inputs():\n"
        f"    tensor_0 = torch.randn({shape}, dtype=torch.float32)\n    return [tensor_0]\n\n"
        f"def fused_operator(tensor_0):\n    tensor_1 = torch.{op}(tensor_0)\n"
        "    return [tensor_1]\n"
    )


def programs(count: int, seed: int = 0, ops: tuple[str, ...] = ("relu",)) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        op = ops[index % len(ops)]
        shape = [rng.randint(2, 24) for _ in range(rng.randint(1, 3))]
        out.append(
            {"id": f"l1-{index:03d}", "level": 1, "ops": [op], "source": program_source(op, shape)}
        )
    return out


def pair(program: dict[str, Any], *, wrong: bool = False) -> dict[str, Any]:
    """A teacher pair as `drtriton teacher build` writes it; `wrong` negates the result."""
    code = KERNEL.format(value=("-" if wrong else "") + OPS[program["ops"][0]])
    return {
        "program_id": program["id"],
        "level": program["level"],
        "ops": program["ops"],
        "prompt": build_prompt(program["source"]),
        "completion": build_completion(code),
        "verdict": "correct",
        "errors": [],
        "problem": program["source"],
    }


def write_data(directory: Path, count: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """programs.jsonl and pairs.jsonl (every other pair wrong) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    records = programs(count, seed)
    prog = directory / "programs.jsonl"
    prog.write_text("".join(json.dumps(r) + "\n" for r in records))
    pairs = directory / "pairs.jsonl"
    lines = [json.dumps(pair(r, wrong=bool(i % 2))) + "\n" for i, r in enumerate(records)]
    pairs.write_text("".join(lines))
    return prog, pairs


# -- fixtures: one sandbox server and one SFT'd policy for the whole session ------------------

WORKER = [sys.executable, "-m", "tests.learner.rl.rl_worker"]


def run_worker(*args: str, timeout_s: float = 900) -> dict[str, Any]:
    """Run `rl_worker` to the end; its last line (JSON) back."""
    proc = subprocess.run(
        [*WORKER, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"rl_worker {args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[str]:
    """A CPU sandbox server (`drtriton sandbox serve`) for the session: "127.0.0.1:PORT".
    Weaker isolation is accepted only when asked for (DRTRITON_TEST_WEAK_ISOLATION=1)."""
    from learner.train.verify import start_local_sandbox

    weak = os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1"
    with start_local_sandbox(workers=2, device="cpu", allow_weak_isolation=weak) as target:
        yield target


@pytest.fixture(scope="session")
def sft_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT with data/ (programs, pairs) and sft/model: a tiny policy after a short SFT."""
    root = tmp_path_factory.mktemp("rl")
    write_data(root / "data")
    result = run_worker("sft", str(root), str(SFT_STEPS))
    assert result["result"]["step"] == SFT_STEPS
    return root
