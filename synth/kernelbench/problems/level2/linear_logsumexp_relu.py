import torch
import torch.nn as nn


class Model(nn.Module):
    """Dense layer, log-sum-exp over the features (kept dim), ReLU."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.logsumexp(self.fc(x), dim=1, keepdim=True)
        return torch.relu(x)


batch_size = 128
in_features = 256
out_features = 512


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
