"""Our own model as a policy: a model directory sampled by the JAX sampler.

The prompt is `synth.teacher.prompt.build_prompt` (what SFT and RL train on), the answer is
read back by `extract_code`. Sampling is reproducible: a sample's randomness depends only on
the seed, the problem's text and the sample's index, never on the other problems asked with
it or on their order (the sampler makes a row independent of its batch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learner.policies.base import PolicyError, Proposal

RUN_MODEL_DIR = "model"  # where a training run keeps its final model (learner/train/run_dir.py)


def resolve_model_dir(path: Path | str) -> Path:
    """The model directory behind `path`: the path itself, or a training run's `model/`."""
    path = Path(path)
    if not path.is_dir():
        raise PolicyError(f"{path}: no such model or run directory")
    # A run directory has a config.json of its own (the training config), so a model is
    # told by its weights: our format's marker or HF safetensors, else the run's `model/`.
    from learner.model.io import FORMAT_FILE

    is_model = (path / FORMAT_FILE).is_file() or any(path.glob("*.safetensors*"))
    if not is_model and (path / RUN_MODEL_DIR).is_dir():
        return path / RUN_MODEL_DIR
    return path


def row_seed(problem: str, sample: int) -> int:
    """A sampler row seed (uint32) naming one sample of one problem, whatever its batch."""
    digest = hashlib.sha256(f"{sample}\n{problem}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def proposal_from_completion(text: str, finish_reason: str, tokens: int) -> Proposal:
    """One sampled answer as a Proposal: a completion cut at the token limit holds no code
    (the reward client never sends one either), nor does one without a code block."""
    from synth.teacher.prompt import extract_code

    if finish_reason == "length":
        return Proposal(
            code=None,
            text=text,
            truncated=True,
            tokens=tokens,
            error="the answer reached max_new_tokens before its code block closed",
        )
    code = extract_code(text)
    error = None if code is not None else "the answer holds no <triton_code> block"
    return Proposal(code=code, text=text, tokens=tokens, error=error)


class CheckpointPolicy:
    """Samples our Qwen2 checkpoint (a model directory, an HF checkpoint, or a run directory).

    `batch` rows (problem x sample) go to the sampler per call; the last call is padded to
    `batch` rows so every call has one shape and compiles once. Temperature 0 is greedy.
    """

    def __init__(
        self,
        model_dir: Path | str,
        *,
        max_new_tokens: int = 1024,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch: int = 16,
        mesh: Any = None,
        top_k: int = 0,
        dtype: str | None = None,
        with_example: bool = False,
    ) -> None:
        from learner.generate.sampler import SamplingParams

        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        try:
            self.params = SamplingParams(
                max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k
            )
        except ValueError as err:
            raise ValueError(f"checkpoint policy: {err}") from None
        self.path = resolve_model_dir(model_dir)
        self.name = f"checkpoint:{model_dir}"
        self.batch = batch
        self.with_example = with_example
        self.sampler = _load_sampler(self.path, dtype=dtype, mesh=mesh)

    def propose(
        self, problems: Sequence[str], samples: int = 1, seed: int = 0
    ) -> list[list[Proposal]]:
        """`samples` answers per problem, in problem order."""
        import dataclasses

        from synth.teacher.prompt import build_prompt

        if samples < 1:
            raise ValueError(f"samples must be at least 1, got {samples}")
        prompts = [build_prompt(p, with_example=self.with_example) for p in problems]
        rows = [(i, s) for i in range(len(problems)) for s in range(samples)]
        params = dataclasses.replace(self.params, seed=seed)
        answers: list[list[Proposal]] = [[] for _ in problems]
        for start in range(0, len(rows), self.batch):
            chunk = rows[start : start + self.batch]
            padded = chunk + [chunk[0]] * (self.batch - len(chunk))
            completions = self.sampler.generate(
                [prompts[i] for i, _ in padded],
                params,
                seeds=[row_seed(problems[i], s) for i, s in padded],
            )
            for (i, _), completion in zip(chunk, completions, strict=False):
                answers[i].append(
                    proposal_from_completion(
                        completion.text or "", completion.finish_reason, len(completion.tokens)
                    )
                )
        return answers


def _load_sampler(path: Path, *, dtype: str | None, mesh: Any) -> Any:
    """A sampler of the model at `path` stopping at `</triton_code>` or an EOS id."""
    from learner import tokenizer as tokenizers
    from learner.generate.sampler import Sampler
    from learner.model import io as model_io
    from learner.model import safetensors_io
    from learner.train.data import DataError, pad_id

    if not tokenizers.has_tokenizer(path):
        raise PolicyError(f"{path}: no tokenizer.json beside the model (prompts are text)")
    try:
        model, facts = model_io.load(path, dtype=dtype, mesh=mesh)
    except (model_io.ModelFormatError, safetensors_io.SafetensorsError) as err:
        raise PolicyError(f"{path}: {err}") from None
    tokenizer = tokenizers.load_tokenizer(path)
    configs = [facts["hf_config"]]
    generation = path / "generation_config.json"
    if generation.is_file():
        configs.append(model_io.read_json(generation))
    eos = tokenizers.eos_token_ids(tokenizer, *configs)
    try:
        pad = pad_id(tokenizer)
    except DataError:
        pad = eos[0] if eos else 0
    return Sampler(model, tokenizer, eos_ids=eos, mesh=mesh, pad_id=pad)
