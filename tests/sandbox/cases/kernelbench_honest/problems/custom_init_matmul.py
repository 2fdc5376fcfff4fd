import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """x @ W^T + b with nn.Linear's own initialisation, written out, then a scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(self.bias, -bound, bound)
        self.scale = scale

    def forward(self, x):
        return (x @ self.weight.t() + self.bias) * self.scale


batch_size = 16
in_features = 40
out_features = 24
scale = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
