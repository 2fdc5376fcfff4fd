"""Our checkpoint as a policy, on a tiny random model: answer shapes, reproducibility, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.policies.base import Policy, PolicyError
from learner.policies.checkpoint import (
    CheckpointPolicy,
    proposal_from_completion,
    resolve_model_dir,
    row_seed,
)
from learner.policies.registry import load_policy
from synth.teacher.prompt import build_completion, build_prompt

MAX_NEW = 6


def problem(index: int) -> str:
    ops = ("relu", "sigmoid", "tanh")
    return (
        "import torch\n\n\ndef get_inputs():\n"
        f"    return [torch.randn([{4 + index}, 8], dtype=torch.float32)]\n\n\n"
        "def fused_operator(tensor_0):\n"
        f"    tensor_1 = torch.{ops[index % 3]}(tensor_0)\n    return [tensor_1]\n"
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's layout: RUN/model, a tiny random model with a BPE of prompt text."""
    from learner.model import io as model_io
    from learner.model import qwen2
    from learner.tokenizer import train_bpe

    texts = [build_prompt(problem(i)) for i in range(3)]
    texts += [build_completion("import triton\n\n@triton.jit\ndef k(x):\n    pass\n")]
    tok = train_bpe(texts * 2, vocab_size=700)
    root = tmp_path_factory.mktemp("run")
    tok_dir = root / "tok"
    tok.save_pretrained(str(tok_dir))
    config = {
        **qwen2.PRESETS["tiny"],
        "vocab_size": -(-len(tok) // 64) * 64,
        "eos_token_id": tok.eos_token_id,
    }
    model_io.init_model_dir(root / "model", config, seed=0, tokenizer_dir=tok_dir)
    (root / "config.json").write_text('{"run_dir": "."}')  # the run's training config
    return root


@pytest.fixture(scope="module")
def policy(run_dir: Path) -> CheckpointPolicy:
    return CheckpointPolicy(run_dir, max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, batch=4)


def texts(answers: list[list]) -> list[list[str]]:
    return [[a.text for a in row] for row in answers]


def test_answers_per_problem_and_sample(policy: CheckpointPolicy) -> None:
    assert isinstance(policy, Policy)
    assert policy.path.name == "model"  # the run directory's model
    answers = policy.propose([problem(0), problem(1), problem(2)], samples=3, seed=0)
    assert [len(row) for row in answers] == [3, 3, 3]  # 9 rows over 3 calls of 4, one padded
    for row in answers:
        for answer in row:
            assert 1 <= answer.tokens <= MAX_NEW
            assert isinstance(answer.text, str)
            assert answer.code is None or answer.error is None
            assert (answer.code is not None) or answer.error  # a random model writes no code
    assert len({a.text for row in answers for a in row}) > 1
    assert policy.propose([], samples=2) == []


def test_reproducible_per_seed_and_independent_of_the_batch(policy: CheckpointPolicy) -> None:
    problems = [problem(0), problem(1), problem(2)]
    first = policy.propose(problems, samples=2, seed=5)
    assert texts(policy.propose(problems, samples=2, seed=5)) == texts(first)
    assert texts(policy.propose(problems, samples=2, seed=6)) != texts(first)
    reordered = policy.propose(problems[::-1], samples=2, seed=5)
    assert texts(reordered[::-1]) == texts(first)  # a sample depends on its problem only


def test_registry_and_bad_paths(run_dir: Path, tmp_path: Path) -> None:
    made = load_policy(f"checkpoint:{run_dir / 'model'}", max_new_tokens=MAX_NEW, temperature=None)
    assert isinstance(made, CheckpointPolicy) and made.name == f"checkpoint:{run_dir / 'model'}"
    assert made.params.temperature == 1.0  # None leaves the default
    with pytest.raises(PolicyError, match="no such"):
        CheckpointPolicy(tmp_path / "missing")
    with pytest.raises(PolicyError):
        CheckpointPolicy(tmp_path)  # an empty directory is no model
    with pytest.raises(PolicyError, match="takes no option"):
        load_policy(f"checkpoint:{run_dir}", api_key_env="X")
    with pytest.raises(ValueError):
        CheckpointPolicy(run_dir, top_p=0.0)


def test_completion_to_proposal() -> None:
    closed = proposal_from_completion("<triton_code>\nx = 1\n</triton_code>", "stop", 9)
    assert closed.code == "x = 1\n" and closed.error is None and closed.tokens == 9
    ended = proposal_from_completion("<triton_code>\nx = 1\n", "eos", 5)
    assert ended.code == "x = 1\n"
    cut = proposal_from_completion("<triton_code>\nx = 1\n", "length", 5)
    assert cut.code is None and cut.truncated and "max_new_tokens" in (cut.error or "")
    empty = proposal_from_completion("no code here", "eos", 3)
    assert empty.code is None and "no <triton_code>" in (empty.error or "")


def test_row_seeds_and_run_dir_resolution(run_dir: Path) -> None:
    assert row_seed("a", 0) == row_seed("a", 0) != row_seed("a", 1)
    assert row_seed("a", 0) != row_seed("b", 0) and 0 <= row_seed("a", 0) < 2**32
    assert resolve_model_dir(run_dir) == run_dir / "model"
    assert resolve_model_dir(run_dir / "model") == run_dir / "model"
