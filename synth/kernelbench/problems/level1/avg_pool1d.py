import torch
import torch.nn as nn


class Model(nn.Module):
    """Average pooling over sequences, window 4, stride 2."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool1d(kernel_size=4, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 16
channels = 32
length = 1024


def get_inputs():
    x = torch.randn(batch_size, channels, length)
    return [x]


def get_init_inputs():
    return []
