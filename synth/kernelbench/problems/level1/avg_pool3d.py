import torch
import torch.nn as nn


class Model(nn.Module):
    """2x2x2 average pooling of a volume."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool3d(kernel_size=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 4
channels = 8
depth = 16
height = 32
width = 32


def get_inputs():
    x = torch.randn(batch_size, channels, depth, height, width)
    return [x]


def get_init_inputs():
    return []
