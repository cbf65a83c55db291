"""SkyRL-gym environments (``skyrl-gym``: ``init(prompt) -> (prompt, metadata)``, ``step(action) -> {observations,
reward, done}``) -> an ``OpenAIAgent`` agent, so that they are played through the same endpoint as any agent: the
model's turns are trained as sampled, the environment's observations are shown to it and masked out of the loss.

SkyRL's conventions: a row names its environment in ``env_class`` and the environment gets the row's other columns
but ``prompt`` as ``extras`` (``reward_spec``, ``extra_info``); an action is the model's whole turn as text (the
request carries no ``tools``, so nothing is parsed out of it); the episode's reward is the sum of its step rewards
(skyrl-train sums a trajectory's token rewards for GRPO). Knows SkyRL-gym's interface and the OpenAI client;
nothing about models or tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from lightning_grpo.engines.multiturn.calls import resolve_tool

REWARDS = ("sum", "last")
ENV_COLUMN = "env_class"  # skyrl-train's dataset column naming each row's environment


class SkyRLGymAgent:
    """A SkyRL-gym environment played by the policy: the ``agent`` of ``OpenAIAgent``.

    Each episode makes its environment (``skyrl_gym.make(env, env_config=..., extras=row)``), asks the policy for a
    turn, steps the environment with the turn's text and sends its observations back, until the environment is done
    (or has nothing to say), ``max_turns`` turns were played or the episode's tokens
    (``sampling.max_completion_length``, every turn counted) are spent. It returns the step rewards' ``sum`` (or the
    ``last``): score it with ``lightning_grpo.engines.agent_reward``. An environment's ``postprocessed_action`` is not
    written back into the conversation: the model is trained on, and continues from, what it sampled.

    Args:
        env: a registered SkyRL-gym id (``"gsm8k"``, or one your code ``skyrl_gym.register``\\ s), an environment
            class (or its import path, ``"pkg.module.Class"``) called as ``Class(env_config=..., extras=...)``, or
            ``None``: each row's ``env_class`` column names a registered id.
        env_config: the environment's ``env_config`` (skyrl-train's ``environment.skyrl_gym.<env>``).
        max_turns: the most model turns an episode plays.
        max_tokens: the most tokens one turn may write (skyrl-train's ``max_generate_length``); ``None``: the
            episode's remaining tokens.
        reward: ``sum`` of the step rewards or the ``last`` one.
        model: the ``model`` field of the requests.

    Example::

        OpenAIAgent(agent=SkyRLGymAgent("gsm8k_multi_turn", max_turns=3))
    """

    def __init__(
        self,
        env: str | Callable | None = None,
        env_config: dict[str, Any] | None = None,
        max_turns: int = 8,
        max_tokens: int | None = None,
        reward: Literal[REWARDS] = "sum",
        model: str = "policy",
    ) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {list(REWARDS)}, got {reward!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 or None (the episode's budget), got {max_tokens!r}")
        import skyrl_gym  # fail here, before any compute, if the package is missing

        if isinstance(env, str) and env not in skyrl_gym.registry:
            if "." not in env:
                raise ValueError(_unknown(env))
            env = resolve_tool(env, "env")  # an import path: the class itself
        self.env, self.env_config, self.max_turns, self.max_tokens = env, env_config, max_turns, max_tokens
        self.reward, self.model = reward, model
        self.request = {"max_tokens": max_tokens} if max_tokens else {}
        self.__name__ = f"SkyRLGymAgent({getattr(env, '__name__', env)})"

    def make(self, row: dict[str, Any]) -> Any:
        """The row's environment, given the row's columns but ``prompt`` (and ``env_class``) as ``extras``."""
        import skyrl_gym

        env = self.env if self.env is not None else row.get(ENV_COLUMN)
        if env is None:
            raise ValueError(f"SkyRLGymAgent has no env and the row has no {ENV_COLUMN!r} column: set one of them")
        extras = {k: v for k, v in row.items() if k not in ("prompt", ENV_COLUMN)}
        if isinstance(env, str):
            if env not in skyrl_gym.registry:
                raise ValueError(f"the row's {ENV_COLUMN} column: {_unknown(env)}")
            return skyrl_gym.make(env, env_config=self.env_config, extras=extras)
        return env(env_config=self.env_config, extras=extras)

    def __call__(self, client: Any, row: dict[str, Any]) -> float:
        environment = self.make(row)
        try:
            rewards = self.play(client, environment, row["prompt"])
        finally:
            environment.close()
        if not rewards:
            return 0.0
        return sum(rewards) if self.reward == "sum" else rewards[-1]

    def play(self, client: Any, environment: Any, prompt: list[dict]) -> list[float]:
        """The episode's turns against ``environment``; its step rewards."""
        messages, _ = environment.init(list(prompt))
        messages, rewards = list(messages), []
        for _ in range(self.max_turns):
            reply = client.chat.completions.create(model=self.model, messages=messages, **self.request)
            choice, written = reply.choices[0], reply.usage.completion_tokens if reply.usage else 0
            if choice.finish_reason == "length" and not written:
                break  # the episode's tokens were spent by the last turn
            text = choice.message.content or ""
            out = environment.step(text)
            rewards.append(float(out.get("reward") or 0.0))
            messages += [{"role": "assistant", "content": text}, *out["observations"]]
            capped = self.max_tokens is not None and written >= self.max_tokens  # this turn's cap, not the budget
            if out["done"] or not out["observations"] or (choice.finish_reason == "length" and not capped):
                break
        return rewards


def _unknown(env_id: Any) -> str:
    import skyrl_gym

    return (
        f"env {env_id!r} is not a registered SkyRL-gym environment: expected one of {sorted(skyrl_gym.registry)} "
        "(register yours with skyrl_gym.register), an environment class or its import path"
    )
