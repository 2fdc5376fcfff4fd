import torch
import torch.nn as nn


class Model(nn.Module):
    """y = W x + b, then y * scale + y: a scaled residual around the product."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * self.scale + y


batch_size = 128
in_features = 768
out_features = 512
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
