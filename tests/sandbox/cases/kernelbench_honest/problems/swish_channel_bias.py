import torch
import torch.nn as nn


class Model(nn.Module):
    """Swish of a 4-D activation plus a learned per-channel bias."""

    def __init__(self, channels):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(channels, 1, 1) * 0.02)

    def forward(self, x):
        return x * torch.sigmoid(x) + self.bias


batch_size = 2
channels = 6
height = 9
width = 11


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
