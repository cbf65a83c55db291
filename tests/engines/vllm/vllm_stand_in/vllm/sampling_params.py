from vllm import _Unavailable

StructuredOutputsParams = _Unavailable
