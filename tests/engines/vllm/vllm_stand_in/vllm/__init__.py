"""A stand-in for the ``vllm`` package on a machine without CUDA, for tests only: what TRL's ``VLLMClient`` imports
from vLLM on the trainer side, with vLLM's NCCL weight broadcast replaced by a TCP stream (``weight_transfer``).
Put this directory on ``PYTHONPATH``; ``tests/engines/vllm/vllm_fake_server.py`` is the server it talks to."""

__version__ = "0.30.0"  # inside TRL 1.16's supported range: its client takes the current code paths


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the vllm stand-in has no engine: it only serves TRL's client in tests")


LLM = RequestOutput = SamplingParams = _Unavailable
