"""radixcluster bench: workloads against a live SGLang- or OpenAI-compatible server, their client and their report."""
