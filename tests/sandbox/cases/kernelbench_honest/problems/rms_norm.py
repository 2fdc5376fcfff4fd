import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalisation over the last dim with a learned gain."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden) * 0.1 + 1.0)
        self.eps = eps

    def forward(self, x):
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * rms * self.weight


batch_size = 3
tokens = 10
hidden = 80


def get_inputs():
    return [torch.randn(batch_size, tokens, hidden)]


def get_init_inputs():
    return [hidden]
