"""Agent engines: prompts -> Rollout played by the user's own agent program, which talks to the policy through an
OpenAI-compatible endpoint on 127.0.0.1 (``endpoint``). ``OpenAIAgent`` (``engine``) gathers the agents' requests,
generates them in batches with a sampler engine (``batches``) and records every served token (``served``);
``SkyRLGymAgent`` (``skyrl``) plays a SkyRL-gym environment as such an agent; ``agent_reward`` is the agent's own
reward.
"""

from lightning_grpo.engines.agents.engine import OpenAIAgent
from lightning_grpo.engines.agents.served import agent_reward
from lightning_grpo.engines.agents.skyrl import SkyRLGymAgent

__all__ = ["OpenAIAgent", "SkyRLGymAgent", "agent_reward"]
