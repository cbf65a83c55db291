"""OpenEnv environments (``openenv-core``: ``reset() -> Observation``, ``step(Action) -> Observation``) -> TRL
``environment_factory`` classes, so that ``ToolCalling`` plays them through the same episode machinery as any other
environment. Runs the environment in this process: no Docker, no server.

The action becomes the episode's one tool: its fields (types and descriptions from the pydantic model) are the
tool's arguments, so the model calls ``step(message="...")``; the observation (its fields but ``done``, ``reward``
and ``metadata``) is the tool's reply; ``reset(**row)`` passes the row's columns that the environment's ``reset``
accepts and returns the first observation, appended to the prompt; ``get_reward()`` is the sum of the step
rewards (or the last). Add ``lightning_grpo.engines.environment_reward`` to ``reward_funcs``. Knows OpenEnv's
interface (duck-typed: ``openenv-core`` is imported only by the user's environment); nothing about models.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, Literal

from lightning_grpo.engines.multiturn.calls import resolve_tool

REWARDS = ("sum", "last")
HIDDEN = ("done", "reward", "metadata")  # observation fields that are the environment's bookkeeping, not its reply


def observation_text(observation: Any) -> str:
    """An observation's own fields as text: one field as its value, several as JSON."""
    fields = {k: v for k, v in observation.model_dump().items() if k not in HIDDEN}
    if len(fields) == 1:
        return str(next(iter(fields.values())))
    return json.dumps(fields, default=str)


class OpenEnvFactory:
    """An ``environment_factory`` for ``ToolCalling`` made from an OpenEnv environment and its action class.

    Args:
        environment: the ``Environment`` class (or any callable returning one), or its import path.
        action: the ``Action`` class (a pydantic model), or its import path.
        tool_name: the name the model calls the action by.
        description: the tool's description; default the action class's docstring.
        reward: ``get_reward()``: the ``sum`` of the step rewards or the ``last`` one.

    Example::

        ToolCalling(environment_factory=OpenEnvFactory(EchoEnvironment, EchoAction))
    """

    def __init__(
        self,
        environment: Callable | str,
        action: type | str,
        tool_name: str = "step",
        description: str | None = None,
        reward: Literal[REWARDS] = "sum",
    ) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {list(REWARDS)}, got {reward!r}")
        if not tool_name.isidentifier() or tool_name in ("reset", "get_reward"):
            raise ValueError(f"tool_name must be a Python name other than reset and get_reward, got {tool_name!r}")
        self.environment = resolve_tool(environment, "environment")
        self.action = resolve_tool(action, "action")
        if not hasattr(self.action, "model_fields"):
            raise ValueError(f"action must be an OpenEnv Action (a pydantic model), got {self.action!r}")
        self.cls = _environment_class(self.environment, self.action, tool_name, description, reward)
        self.__name__ = self.cls.__name__

    def __call__(self) -> Any:
        return self.cls()


def _environment_class(environment: Callable, action: type, name: str, description: str | None, reward: str) -> type:
    fields = {k: f for k, f in action.model_fields.items() if k != "metadata"}

    def act(self: Any, **kwargs: Any) -> str:
        if self.done:
            return "the episode is over: answer without calling the tool"
        observation = self.env.step(action(**kwargs))
        self.rewards.append(float(observation.reward or 0.0))
        self.done = bool(observation.done)
        return observation_text(observation)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=f.annotation) for k, f in fields.items()]
    act.__signature__ = inspect.Signature(params, return_annotation=str)
    act.__annotations__ = {**{k: f.annotation for k, f in fields.items()}, "return": str}
    summary = description or inspect.getdoc(action) or f"Act in {getattr(environment, '__name__', 'the environment')}"
    args = "".join(f"\n    {k}: {f.description or k}" for k, f in fields.items())
    act.__doc__ = f"{summary.splitlines()[0]}\n\nArgs:{args}"
    act.__name__ = act.__qualname__ = name

    def reset(self: Any, **row: Any) -> str | None:
        accepted = inspect.signature(self.env.reset).parameters
        keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        observation = self.env.reset(**{k: v for k, v in row.items() if keywords or k in accepted})
        self.rewards, self.done = [], bool(getattr(observation, "done", False))
        return None if observation is None else observation_text(observation)

    def get_reward(self: Any) -> float:
        if not self.rewards:
            return 0.0
        return sum(self.rewards) if reward == "sum" else self.rewards[-1]

    def init(self: Any) -> None:
        self.env, self.rewards, self.done = environment(), [], False

    title = getattr(environment, "__name__", "Environment")
    return type(title, (), {"__init__": init, name: act, "reset": reset, "get_reward": get_reward})
