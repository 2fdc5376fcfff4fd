"""Suite-wide set-up: without a GPU, Triton runs kernels with its CPU interpreter.

Triton reads TRITON_INTERPRET once, when it is first imported, so it is set here,
before any test module can import it. The sandbox is unaffected: its grader
workers and candidate processes set their own environment.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
