import torch


def get_inputs():
    tensor_0 = torch.randn([1024, 1024], dtype=torch.float32)
    tensor_1 = torch.randn([1024, 1024], dtype=torch.float32)
    return [tensor_0, tensor_1]


def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.mul(tensor_0, tensor_1)
    tensor_3 = torch.add(tensor_2, tensor_0)
    return [tensor_3]
