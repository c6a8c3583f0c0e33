"""warmllm engine: GGUF loading, quant kernels, the Qwen3.5 forward, sessions and generation.

Importable without AWS. Data flows one way: tokens -> session -> forward -> logits -> sampling.
"""
