import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolution, minimum over channels (kept dim), then tanh twice."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.min(self.conv(x), dim=1, keepdim=True)[0]
        return torch.tanh(torch.tanh(x))


batch_size = 8
in_channels = 8
out_channels = 16
height = 48
width = 48


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
