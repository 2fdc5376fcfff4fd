import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Scaled dot-product attention written out: softmax(Q K^T / sqrt(d)) V."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        return torch.matmul(torch.softmax(scores, dim=-1), v)


batch_heads = 16
seq_len = 128
head_dim = 64


def get_inputs():
    q = torch.randn(batch_heads, seq_len, head_dim)
    k = torch.randn(batch_heads, seq_len, head_dim)
    v = torch.randn(batch_heads, seq_len, head_dim)
    return [q, k, v]


def get_init_inputs():
    return [head_dim]
