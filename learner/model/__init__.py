"""The policy network: `qwen2` (config, math, modules), `params` (HF weight map, partition
rules), `io` (model directories, HF import/export), `safetensors_io`, `logprobs` (scoring)."""
