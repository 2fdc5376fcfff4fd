import torch


def get_inputs():
    tensor_0 = torch.randn([33, 64], dtype=torch.float32)
    tensor_1 = torch.randn([64, 40], dtype=torch.float32)
    return [tensor_0, tensor_1]


def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.matmul(tensor_0, tensor_1)
    tensor_3 = torch.relu(tensor_2)
    return [tensor_3]
