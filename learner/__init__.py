"""The policy: a Flax NNX Qwen2, its checkpoints, tokenizer, sampler and sharding.

Packages: `model` (the network, its parameter tables, checkpoints, per-token log-probs) and
`generate` (sampler and decode kernels). Modules: `sharding`, `tokenizer`, `cli`. Nothing here
imports torch or triton.
"""
