"""Dataset rows -> environment instances (TRL 1.16's ``environment_factory`` semantics), and their rewards.

One instance per rollout; its public methods (all but ``reset`` and ``get_reward``) are the episode's tools;
``reset(**row)`` returns ``None`` or text appended to the last user message; an optional ``get_reward()`` scores
the finished episode from the environment's state. A dict of factories picks the environment of each row by its
``environment`` column. Knows environments and rows; nothing about models or tokens.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from lightning_grpo.engines.multiturn.calls import resolve_tool, tool_schema

SETTING = "environment_factory"
RESERVED = ("reset", "get_reward")


def environment_tools(environment: Any) -> list[Callable]:
    """The environment's public methods, bound: what the model may call (TRL: every public function)."""
    names = [n for n, _ in inspect.getmembers(type(environment), inspect.isfunction)]
    return [getattr(environment, n) for n in names if n not in RESERVED and not n.startswith("_")]


class Environments:
    """The factories and a pool of their instances, reused across steps (``reset`` starts each episode).

    Args:
        factory: a callable returning an environment (a class, or its import path), or ``{name: factory}``:
            each row then picks one with its ``environment`` column.
    """

    def __init__(self, factory: Callable | str | dict[str, Callable | str]) -> None:
        named = factory if isinstance(factory, dict) else {None: factory}
        if not named:
            raise ValueError(f"{SETTING} must be a callable or a non-empty {{name: callable}} dict, got {{}}")
        self.multi = isinstance(factory, dict)
        self.factories = {name: resolve_tool(f, SETTING) for name, f in named.items()}
        self.pool: dict[str | None, list[Any]] = {name: [self._create(name)] for name in self.factories}
        self.schemas = {
            name: [tool_schema(t, SETTING) for t in environment_tools(p[0])] for name, p in self.pool.items()
        }

    def _create(self, name: str | None) -> Any:
        environment = self.factories[name]()
        if not callable(getattr(environment, "reset", None)):
            raise ValueError(f"{SETTING}: {type(environment).__name__} must define a callable reset(**row)")
        return environment

    def names(self, rows: list[dict[str, Any]]) -> list[str | None]:
        """Each row's environment: the ``environment`` column under a dict of factories."""
        if not self.multi:
            return [None] * len(rows)
        names = [row.get("environment") for row in rows]
        unknown = sorted({repr(n) for n in names if n not in self.factories})
        if unknown:
            raise ValueError(
                f"the 'environment' column holds {', '.join(unknown)}, which {SETTING} does not name: expected one "
                f"of {sorted(self.factories)}"
            )
        return names

    def start(self, prompts: list[list[dict]], rows: list[dict[str, Any]]) -> tuple[list[Any], list[list[dict]]]:
        """One reset instance per row, and the prompts with what ``reset`` returned appended to the last message."""
        names, taken = self.names(rows), {name: 0 for name in self.factories}
        environments, started = [], []
        for prompt, row, name in zip(prompts, rows, names):
            pool = self.pool[name]
            if taken[name] == len(pool):
                pool.append(self._create(name))
            environment = pool[taken[name]]
            taken[name] += 1
            kwargs = {k: v for k, v in row.items() if k != "environment"} if self.multi else row
            observation = environment.reset(**kwargs)
            if observation is not None:
                last = prompt[-1]
                prompt = [*prompt[:-1], {**last, "content": last["content"] + str(observation)}]
            environments.append(environment)
            started.append(prompt)
        return environments, started

    def schemas_of(self, rows: list[dict[str, Any]]) -> list[list[dict]]:
        return [self.schemas[name] for name in self.names(rows)]


def episode_rewards(environments: list[Any]) -> tuple[dict[str, list[Any]], dict[str, float]]:
    """``get_reward()`` of each finished episode: the ``environment_reward`` column ([N], ``None`` where the
    environment has none) and its mean per environment class (``rewards/<Class>/mean``)."""
    values = [_reward(e) for e in environments]
    by_class: dict[str, list[float]] = {}
    for environment, value in zip(environments, values):
        if value is not None:
            by_class.setdefault(type(environment).__name__, []).append(value)
    metrics = {f"rewards/{name}/mean": sum(v) / len(v) for name, v in by_class.items()}
    return {"environment_reward": values, "environments": list(environments)}, metrics


def _reward(environment: Any) -> float | None:
    get_reward = getattr(environment, "get_reward", None)
    if get_reward is None:
        return None
    value = get_reward()
    return float(asyncio.run(value) if inspect.iscoroutine(value) else value)


def environment_reward(completions: list[Any], environment_reward: list[float | None], **kwargs: Any) -> list:
    """The environment's own score of each episode (its ``get_reward()``), as a reward function: add
    ``lightning_grpo.engines.environment_reward`` to ``reward_funcs`` (TRL adds it by itself, weight 1).

    >>> environment_reward(["a", "b"], environment_reward=[1.0, None])
    [1.0, None]
    """
    return list(environment_reward)
