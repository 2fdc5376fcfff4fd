"""The prompt and the answer format shared by SFT and RL."""

from __future__ import annotations

from synth.teacher.prompt import CLOSE_TAG, OPEN_TAG, build_completion, build_prompt, extract_code

from .programs import render

SOURCE = render([[4, 8]], ["torch.relu({0})"])
CODE = "import torch\n\n\ndef triton_fused_operator(tensor_0):\n    return [tensor_0]\n"


def test_prompt_states_the_task_and_embeds_the_program() -> None:
    prompt = build_prompt(SOURCE)
    assert SOURCE.strip() in prompt
    for phrase in (
        "triton_fused_operator",
        "@triton.jit",
        "coalesced",
        "mask",
        OPEN_TAG,
        CLOSE_TAG,
    ):
        assert phrase in prompt
    assert prompt.index("Requirements") < prompt.index(SOURCE.strip())
    assert "relu_kernel" in build_prompt(SOURCE, with_example=True)
    assert "relu_kernel" not in prompt


def test_completion_round_trips() -> None:
    assert extract_code(build_completion(CODE)) == CODE
    assert extract_code("thinking...\n" + build_completion(CODE) + "\ntrailing words") == CODE


def test_extract_code_tolerates_fences_and_a_dropped_closing_tag() -> None:
    fenced = f"{OPEN_TAG}\n```python\n{CODE}```\n{CLOSE_TAG}"
    assert extract_code(fenced) == CODE
    assert extract_code(f"{OPEN_TAG}\n{CODE}") == CODE  # the sampler stopped on the tag
    assert (
        extract_code(f"draft {OPEN_TAG}old{CLOSE_TAG} final {OPEN_TAG}\n{CODE}{CLOSE_TAG}") == CODE
    )


def test_extract_code_without_an_answer() -> None:
    assert extract_code("no code here") is None
    assert extract_code(f"{OPEN_TAG}\n  \n{CLOSE_TAG}") is None


def test_extract_code_is_linear_in_blank_lines() -> None:
    """Small models often emit blank lines up to the length limit: every completion goes
    through this, so a run of them must not cost seconds."""
    import time

    started = time.process_time()
    extract_code("<triton_code>\n```python\n" + "\n" * 20_000)
    extract_code("<triton_code>\n```python\n" + "\n" * 20_000 + "```")
    assert time.process_time() - started < 1.0
