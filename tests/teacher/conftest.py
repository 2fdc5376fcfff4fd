"""The teacher's tests run every candidate against PyTorch.

Without a GPU, kernels run on CPU tensors under Triton's interpreter, which Triton
only honours when TRITON_INTERPRET=1 is set before it is first imported: this
conftest sets it at import time (run this directory on its own, or with the
variable set, if another part of the suite imports triton first). With a GPU the
same tests run the compiled kernels on it.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def triton_mode() -> None:
    if DEVICE != "cpu":
        return
    import triton.language as tl

    from synth.teacher.check import fix_interpreter_scalar_index

    if type(tl.standard.cdiv).__name__ != "InterpretedFunction":
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set: rerun with it set")
    fix_interpreter_scalar_index()
