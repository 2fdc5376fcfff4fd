import torch
import torch.nn as nn


class Model(nn.Module):
    """LeakyReLU with a slope of 0.1 (not the default 0.01)."""

    def __init__(self, negative_slope: float):
        super().__init__()
        self.act = nn.LeakyReLU(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


batch_size = 128
features = 4096
negative_slope = 0.1


def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]


def get_init_inputs():
    return [negative_slope]
