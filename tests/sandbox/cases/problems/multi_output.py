import torch


def get_inputs():
    tensor_0 = torch.randn([24, 40], dtype=torch.float32)
    tensor_1 = torch.randn([24, 40], dtype=torch.float32)
    return [tensor_0, tensor_1]


def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.add(tensor_0, tensor_1)
    tensor_3 = torch.relu(tensor_2)
    tensor_4 = torch.sum(tensor_2, dim=1)
    return [tensor_3, tensor_4]
