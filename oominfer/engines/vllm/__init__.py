"""vLLM: the command line that serves a plan (``argv``) and the rules vLLM enforces on a plan
(``rules``), both pure."""

from oominfer.engines.vllm.argv import SERVER_MODULE, serve_argv, to_vllm_args

__all__ = ["SERVER_MODULE", "serve_argv", "to_vllm_args"]
