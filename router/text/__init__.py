"""Text in and out of the router: tokenizers (GGUF or tokenizer.json), chat templates, and incremental detokenizing with stop strings."""
