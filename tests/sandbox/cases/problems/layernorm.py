import torch
import torch.nn.functional as F


def get_inputs():
    tensor_0 = torch.randn([29, 64], dtype=torch.float32)
    tensor_1 = torch.randn([64], dtype=torch.float32)
    tensor_2 = torch.randn([64], dtype=torch.float32)
    return [tensor_0, tensor_1, tensor_2]


def fused_operator(tensor_0, tensor_1, tensor_2):
    tensor_3 = F.layer_norm(tensor_0, [64], tensor_1, tensor_2, eps=1e-05)
    return [tensor_3]
