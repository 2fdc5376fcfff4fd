import torch
import torch.nn as nn


class Model(nn.Module):
    """Rows divided by their L2 norm."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.norm(x, dim=1, keepdim=True)


batch_size = 64
features = 4096


def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]


def get_init_inputs():
    return []
