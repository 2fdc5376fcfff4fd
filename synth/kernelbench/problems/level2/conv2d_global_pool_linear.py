import torch
import torch.nn as nn


class Model(nn.Module):
    """A small classifier head: conv, ReLU, global average pool, dense layer."""

    def __init__(self, in_channels: int, hidden: int, classes: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden, 3, padding=1)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x))
        x = x.mean(dim=[2, 3])
        return self.fc(x)


batch_size = 16
in_channels = 8
hidden = 32
classes = 10
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, hidden, classes]
