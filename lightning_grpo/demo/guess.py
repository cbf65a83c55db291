"""A worked OpenEnv environment: guess a row's answer with higher/lower hints, played by ``ToolCalling`` through
``OpenEnvFactory`` (``templates/openenv_cpu.yaml``). Needs ``openenv-core`` (``pip install lightning-grpo[openenv]``).

An OpenEnv environment is three classes: an ``Action`` (a pydantic model: its fields become the tool's arguments,
their ``description`` the schema's), an ``Observation`` (its fields but ``done``, ``reward`` and ``metadata`` become
the tool's reply: one field as its value, several as JSON) and the ``Environment`` (``reset(**row) -> Observation``,
``step(action) -> Observation``, ``state``). ``reset`` gets the dataset row's columns that it names (here
``answer``); its observation is appended to the prompt. The episode's reward is the sum of the step rewards
(``OpenEnvFactory(reward="last")``: the last), given to the reward function ``environment_reward``.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

MAX_GUESSES = 3  # the environment ends the episode after this many guesses


class GuessAction(Action):
    """Guess the answer."""

    guess: int = Field(..., description="your guess, a whole number")


class HintObservation(Observation):
    """What the model reads back: ``hint`` is the observation's one own field, so the tool's reply is its text."""

    hint: str = ""


class GuessEnvironment(Environment):
    """Reward 1.0 for guessing the row's ``answer`` within ``MAX_GUESSES`` guesses; each wrong guess is answered
    ``higher`` or ``lower``.

    Example::

        from lightning_grpo.engines import OpenEnvFactory, ToolCalling

        ToolCalling(environment_factory=OpenEnvFactory(GuessEnvironment, GuessAction, tool_name="guess"))
    """

    def __init__(self) -> None:
        super().__init__()
        self.target, self.guesses = 0, 0

    def reset(self, answer: str = "0", **kwargs: Any) -> HintObservation:
        """Start an episode on a row: ``answer`` is the row's column of that name (``tiny-mul``: the product)."""
        self.target, self.guesses = int(answer), 0
        return HintObservation(hint=f" You have {MAX_GUESSES} guesses.", done=False, reward=0.0)

    def step(self, action: GuessAction, **kwargs: Any) -> HintObservation:
        self.guesses += 1
        if action.guess == self.target:
            return HintObservation(hint="correct", done=True, reward=1.0)
        hint = "higher" if action.guess < self.target else "lower"
        return HintObservation(hint=hint, done=self.guesses >= MAX_GUESSES, reward=0.0)

    @property
    def state(self) -> State:
        return State(step_count=self.guesses)
