"""The api process: FastAPI routes (SGLang-native and OpenAI), their schemas, auth, errors, metrics and the ZeroMQ client of the router. It knows nothing of tokens or caches."""
