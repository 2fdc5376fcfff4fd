import torch


def get_inputs():
    tensor_0 = torch.randn([37, 45], dtype=torch.float32)
    tensor_1 = torch.randn([37, 45], dtype=torch.float32)
    return [tensor_0, tensor_1]


def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.sigmoid(tensor_0)
    tensor_3 = torch.mul(tensor_2, tensor_1)
    return [tensor_3]
