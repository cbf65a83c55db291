"""Multi-turn engines: chat prompts -> episodes of several model turns, with the tool results and environment
observations between them kept out of the loss (``tool_mask``). ``ToolCalling`` (``tools``) runs TRL's ``tools`` /
``environment_factory`` loop: tool calls parsed from the text and run (``calls.py``), environments stepped
(``environments``, OpenEnv ones through ``OpenEnvFactory``: ``openenv``), episodes tokenised without re-tokenising
(``episodes``); ``RolloutFunction`` (``custom``) hands the whole rollout to a user's ``rollout_func``.
"""

from lightning_grpo.engines.multiturn.calls import HermesParser, ToolCall
from lightning_grpo.engines.multiturn.custom import RolloutFunction
from lightning_grpo.engines.multiturn.engine import ToolCalling
from lightning_grpo.engines.multiturn.environments import environment_reward
from lightning_grpo.engines.multiturn.openenv import OpenEnvFactory

__all__ = ["HermesParser", "OpenEnvFactory", "RolloutFunction", "ToolCall", "ToolCalling", "environment_reward"]
