import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean over one dimension of a 3-D tensor."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.mean(x, dim=self.dim)


batch_size = 5
dim1 = 33
dim2 = 17


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
