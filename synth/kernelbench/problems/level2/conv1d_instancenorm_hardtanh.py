import torch
import torch.nn as nn


class Model(nn.Module):
    """1D convolution, instance norm over each sequence, HardTanh."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 5, padding=2)
        self.norm = nn.InstanceNorm1d(out_channels)
        self.act = nn.Hardtanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


batch_size = 16
in_channels = 16
out_channels = 32
length = 256


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels]
