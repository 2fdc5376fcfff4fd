import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU on a large 2D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 128
features = 4096


def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]


def get_init_inputs():
    return []
