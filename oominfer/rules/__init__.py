"""vLLM's rules on a plan, as data, each read from vLLM's own source (0.32 and 0.33).

The planner proposes only what these accept and the estimator follows them, so a plan that
vLLM would refuse on a real GPU is never written:

- ``dtypes``: the compute dtype ``--dtype auto`` resolves to, and float16 refusals;
- ``quantization``: each method's minimum compute capability, dtypes, flags and engine;
- ``kv_cache``: the KV-cache dtypes a GPU and a release accept;
- ``parallel``: tensor- and pipeline-parallel layouts, and the executor across nodes;
- ``attention``: block sizes per attention backend, CUDA-graph capture sizes, Mamba state
  blocks per request;
- ``versions``: what changed in the memory profile between releases.

Every rule names the vLLM file it was read from (``SOURCE`` or a ``source`` field), and
tests/test_vllm_rules.py has a test per rule that reads like the rule.
"""
