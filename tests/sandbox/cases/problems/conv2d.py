import torch
import torch.nn.functional as F


def get_inputs():
    tensor_0 = torch.randn([2, 3, 17, 15], dtype=torch.float32)
    tensor_1 = torch.randn([5, 3, 3, 3], dtype=torch.float32)
    tensor_2 = torch.randn([5], dtype=torch.float32)
    return [tensor_0, tensor_1, tensor_2]


def fused_operator(tensor_0, tensor_1, tensor_2):
    tensor_3 = F.conv2d(tensor_0, tensor_1, tensor_2, stride=1, padding=1)
    return [tensor_3]
