"""Generation: `sampler` (batched sampling on a KV cache), `decode` (the fused decode path),
`decode_kernels` and `greedy_kernels` (its Pallas kernels)."""
