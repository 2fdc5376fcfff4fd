"""The policy: a Flax NNX Qwen2, its checkpoints, tokenizer, sampler and sharding.

Modules: `qwen2` (the model, its partition rules and HF weight map), `model_io` (model
directories, HF import/export), `safetensors_io`, `sampler`, `logprobs`, `sharding`,
`tokenizer`, `cli`. Nothing here imports torch or triton.
"""
