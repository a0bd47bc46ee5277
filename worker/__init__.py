"""Model workers: weights, the forward pass on a paged KV cache, tensor parallelism, sampling."""
