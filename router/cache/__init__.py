"""The radix cache: the tree over token ids, its eviction heap, the KV page allocator, the slot pool, and the request-level bookkeeping over them."""
