import torch
import torch.nn as nn


class Model(nn.Module):
    """Log-softmax over the last dim of a 3D input."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


batch_size = 16
tokens = 32
vocab = 1024


def get_inputs():
    x = torch.randn(batch_size, tokens, vocab)
    return [x]


def get_init_inputs():
    return []
