import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Dense layer, LeakyReLU (slope 0.2), then an elementwise product with a gate input."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.fc(x), negative_slope=0.2) * gate


batch_size = 128
in_features = 512
out_features = 512


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randn(batch_size, out_features)]


def get_init_inputs():
    return [in_features, out_features]
