"""Problems the search tests share, and a way to run one's reference in this process."""

from __future__ import annotations

from typing import Any

import torch

# Seven operators; values cross several boundaries (tensor_4 is read three steps later),
# two outputs, and the last step is a view (transpose).
SEVEN_OPS = """\
import torch
import torch.nn.functional as F


def get_inputs():
    tensor_0 = torch.randn([6, 8], dtype=torch.float32)
    tensor_1 = torch.randn([8, 5], dtype=torch.float32)
    tensor_2 = torch.randn([6, 1], dtype=torch.float32)
    return [tensor_0, tensor_1, tensor_2]


def fused_operator(tensor_0, tensor_1, tensor_2):
    tensor_3 = torch.matmul(tensor_0, tensor_1)
    tensor_4 = torch.add(tensor_3, tensor_2)
    tensor_5 = torch.relu(tensor_4)
    tensor_6 = torch.softmax(tensor_5, dim=1)
    tensor_7 = torch.sum(tensor_6, dim=0, keepdim=True)
    tensor_8 = torch.mul(tensor_4, tensor_7)
    tensor_9 = torch.transpose(tensor_8, -2, -1)
    return [tensor_9, tensor_6]
"""

# The same program as a person might write it: free names, one of them reused.
SEVEN_OPS_FREE_NAMES = """\
import torch


def get_inputs():
    return [torch.randn([6, 8]), torch.randn([8, 5]), torch.randn([6, 1])]


def fused_operator(x, w, b):
    \"\"\"A docstring is allowed.\"\"\"
    t = torch.matmul(x, w)
    pre: torch.Tensor = torch.add(t, b)
    t = torch.relu(pre)
    probs = torch.softmax(t, dim=1)
    t = torch.sum(probs, dim=0, keepdim=True)
    t = torch.mul(pre, t)
    return [torch.transpose(t, -2, -1), probs]
"""

FOUR_OPS = """\
import torch
import torch.nn.functional as F


def get_inputs():
    tensor_0 = torch.randn([8, 16], dtype=torch.float32)
    tensor_1 = torch.randn([16, 12], dtype=torch.float32)
    return [tensor_0, tensor_1]


def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.matmul(tensor_0, tensor_1)
    tensor_3 = torch.relu(tensor_2)
    tensor_4 = torch.sigmoid(tensor_3)
    tensor_5 = torch.sum(tensor_4, dim=1, keepdim=True)
    return [tensor_5]
"""


def load(source: str) -> Any:
    """The problem (or candidate) imported from a real file (Triton needs one)."""
    from synth.teacher.check import import_source

    return import_source(source)


def reference(source: str, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs, outputs) of a problem for `seed`."""
    module = load(source)
    torch.manual_seed(seed)
    inputs = module.get_inputs()
    with torch.no_grad():
        return inputs, list(module.fused_operator(*inputs))
