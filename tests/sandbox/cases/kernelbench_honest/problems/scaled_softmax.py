import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the last dim of a scaled 3-D input."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=-1)


batch_size = 4
seq_len = 12
dim = 100
scale = 2.5


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [scale]
