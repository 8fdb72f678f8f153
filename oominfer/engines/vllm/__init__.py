"""vLLM: the command line that serves a plan (``argv``), pure. vLLM's rules on a plan live
in ``oominfer.rules``; its flags are declared in ``oominfer.settings``."""

from oominfer.engines.vllm.argv import SERVER_MODULE, serve_argv

__all__ = ["SERVER_MODULE", "serve_argv"]
