"""The prompts whose greedy continuations must equal transformers' (float32), and which bfloat16
must mostly agree with: the model runner's and the served cluster's."""

RUNNER_PROMPTS = ["The three primary colors are", "List the planets of the solar system:\n1."]
RUNNER_NEW_TOKENS = 32

SERVER_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "你是一个资深Python工程师，请回答以下问题：\n\n如何实现一个LRU缓存？",
    "The three primary colors are",
    "Water boils at",
    "1, 2, 3, 4, 5,",
    "<|im_start|>user\nWhat is a radix tree?<|im_end|>\n<|im_start|>assistant\n",
]
SERVER_NEW_TOKENS = 16
