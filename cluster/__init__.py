"""radixcluster: an LLM serving cluster whose KV cache lives in one radix tree."""

__version__ = "0.1.0"
