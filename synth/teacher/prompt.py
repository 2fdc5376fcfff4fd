"""The task prompt and answer format, shared by SFT data, RL sampling and evaluation.

One place defines what the policy is asked and how its answer is read back, so the
teacher's pairs, the RL prompts and the evaluation harness can never drift apart.
The instructions follow the paper's synthetic-benchmark prompt in substance (identical
results, one fused `@triton.jit` kernel where possible, `triton_fused_operator`,
coalesced and masked accesses, code only between the tags), worded independently.
"""

from __future__ import annotations

OPEN_TAG = "<triton_code>"
CLOSE_TAG = "</triton_code>"

INSTRUCTIONS = """\
You are an expert in GPU programming. Rewrite the PyTorch program below as an efficient \
Triton implementation that computes exactly the same results, as fast as possible.

Requirements:
1. Define `triton_fused_operator` with the same arguments as `fused_operator`, returning \
the same list of tensors (same shapes, dtype float32). Import torch, triton and \
triton.language as tl yourself.
2. Compute everything inside `@triton.jit` kernels. PyTorch may only allocate outputs \
(torch.empty and similar) and read shapes and strides; it must not compute any part of \
the result. Never modify the inputs or return one of them.
3. Fuse all operations into a single `@triton.jit` kernel when possible; use more kernels \
only where an operation needs a separate pass.
4. Read sizes and strides from the tensors at run time instead of hard-coding the example \
shapes, and handle broadcasting and strides correctly.
5. Make memory accesses coalesced, mask every load and store at tensor boundaries, avoid \
redundant reads and writes, and choose block sizes that suit the problem.
6. Keep float32 accuracy: accumulate in float32 and avoid approximations that change \
results beyond rounding.

Answer with the complete Python module only, between {open} and {close}, with no other text.
"""

EXAMPLE = """\
Example of the expected answer for `tensor_1 = torch.relu(tensor_0)`:
{open}
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


def triton_fused_operator(tensor_0):
    tensor_0 = tensor_0.contiguous()
    out = torch.empty_like(tensor_0)
    n_elements = out.numel()
    relu_kernel[(triton.cdiv(n_elements, 1024),)](tensor_0, out, n_elements, BLOCK_SIZE=1024)
    return [out]
{close}
"""


def build_prompt(problem_source: str, *, with_example: bool = False) -> str:
    """The user prompt for one problem (functional-format PyTorch source)."""
    parts = [INSTRUCTIONS.format(open=OPEN_TAG, close=CLOSE_TAG)]
    if with_example:
        parts.append(EXAMPLE.format(open=OPEN_TAG, close=CLOSE_TAG))
    parts.append(f"PyTorch program:\n```python\n{problem_source.strip()}\n```\n")
    return "\n".join(parts)


def build_completion(code: str) -> str:
    """The answer the teacher gives for its SFT pairs: the module between the tags."""
    return f"{OPEN_TAG}\n{code.strip()}\n{CLOSE_TAG}"


def _unfenced(body: str) -> str:
    """`body` without a markdown fence around it (an opening line of backticks and a
    language name, a closing line of backticks). String operations, not a regular
    expression: a model's run of blank lines must cost linear time."""
    text = body.strip()
    if not text.startswith("```"):
        return body
    first_newline = text.find("\n")
    if first_newline < 0:
        return body
    if not all(c.isalnum() or c in "_+-" for c in text[3:first_newline].strip()):
        return body
    inner = text[first_newline + 1 :]
    stripped = inner.rstrip()
    if not stripped.endswith("```"):
        return body
    return stripped[:-3]


def extract_code(completion: str) -> str | None:
    """The module inside the last `<triton_code>` block, or None when there is none.

    A missing closing tag is accepted at the end of the text (samplers often stop on
    it and drop it); markdown fences inside the block are removed.
    """
    start = completion.rfind(OPEN_TAG)
    if start < 0:
        return None
    body = completion[start + len(OPEN_TAG) :]
    end = body.find(CLOSE_TAG)
    if end >= 0:
        body = body[:end]
    body = _unfenced(body).strip("\n")
    return body + "\n" if body.strip() else None
