import torch
import torch.nn as nn


class Model(nn.Module):
    """x + LayerNorm(W x + b): a post-norm residual around a dense layer."""

    def __init__(self, features: int):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.fc(x))


batch_size = 128
features = 512


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
