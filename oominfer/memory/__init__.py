"""The memory model: (model, hardware, settings) -> a per-GPU breakdown.

For vLLM (paged KV cache, profiling run, CUDA graphs) and the transformers engine.
"""
