"""The engines oominfer runs: vLLM's command line, and oominfer's own transformers server."""
