"""Text in and out of the router: tokenizers (GGUF or tokenizer.json), chat templates, incremental detokenizing with stop strings, and the prompt memo."""
