"""SkyRL-gym environments through the agent endpoint (``engines.SkyRLGymAgent`` in ``OpenAIAgent``): a tiny local
multi-turn environment (a ``skyrl_gym`` ``BaseTextEnv``, registered with ``skyrl_gym.register``) played over real
HTTP with the real ``openai`` client, and trained on with a real ``Trainer.fit``. skyrl-gym's own ``gsm8k`` scores a
row written in skyrl-train's dataset format."""

from __future__ import annotations

import json

import pytest
from helpers import fit, logged, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.engines import OpenAIAgent, SkyRLGymAgent, agent_reward
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy

pytest.importorskip("openai")
skyrl_gym = pytest.importorskip("skyrl_gym")
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

SAMPLING = SamplingConfig(max_completion_length=24)
WORDS = ["apple", "berry"]  # a random model never starts a turn with one
CLOSED: list[str] = []


class SayWordEnv(BaseTextEnv):
    """Say the row's word (``reward_spec.ground_truth``): 1.0 for a turn that starts with it, done then or after
    ``extra_info.max_turns`` turns; a wrong turn is told to try again."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.word = extras["reward_spec"]["ground_truth"]
        self.max_turns = int(extras["extra_info"]["max_turns"])
        self.actions: list[str] = []

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.actions.append(action)
        right = action.strip().startswith(self.word)
        done = right or self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": f"No: try {self.word}{self.turns}."}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(right), done=done, metadata={})

    def close(self) -> None:
        CLOSED.append(self.word)


skyrl_gym.register(id="lightning-grpo-say-word", entry_point=SayWordEnv)


def rows(words: str, max_turns: int = 3) -> list[dict]:
    """skyrl-train's dataset format: the prompt, the environment's id, its extras."""
    return [
        {
            "prompt": [{"role": "user", "content": f"Say {w}."}],
            "env_class": "lightning-grpo-say-word",
            "reward_spec": {"method": "rule", "ground_truth": w},
            "extra_info": {"max_turns": max_turns},
        }
        for w in words
    ]


def columns(data: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in data] for k in data[0] if k != "prompt"}


def test_the_environment_s_observations_are_shown_and_masked(tiny_model_dir):
    """Every episode plays its turns against its own environment: the observations reach the model as prompt tokens
    (masked), the model's turns are what it sampled, and each environment is closed."""
    policy, data = Policy(tiny_model_dir), rows(WORDS)
    CLOSED.clear()
    engine = OpenAIAgent(SkyRLGymAgent(max_tokens=6), timeout=60)  # each row's env_class names the environment
    rollout = engine.generate(policy, [r["prompt"] for r in data], 2, SAMPLING, greedy=False, columns=columns(data))
    tokenizer = policy.tokenizer
    assert sorted(CLOSED) == sorted(WORDS * 2)
    assert rollout.metrics["turns/mean"] == 3  # the random model never says the word: every episode plays 3 turns
    for i in range(len(rollout)):
        word, model = WORDS[i // 2], rollout.tool_mask[i].bool()
        shown = tokenizer.decode(rollout.completion_ids[i][(rollout.completion_mask[i].bool() & ~model)])
        assert f"No: try {word}1." in shown and f"No: try {word}2." in shown  # both observations, masked
        assert 3 <= int(model.sum()) <= 18  # the model's own tokens: 3 turns of 1-6
        assert "Say" not in shown and rollout.columns["agent_reward"][i] == 0.0
    assert rollout.metrics["agents/restarts"] == 0 and rollout.metrics["agents/errors"] == 0


def test_max_turns_and_the_sum_of_step_rewards(tiny_model_dir):
    """An environment that never ends on its own stops at ``max_turns``; the reward is the steps' sum or last."""

    class EveryTurnPays(SayWordEnv):
        def step(self, action: str) -> BaseTextEnvStepOutput:
            out = super().step(action)
            return {**out, "reward": 0.5, "done": False, "observations": [{"role": "user", "content": "More."}]}

    policy, data = Policy(tiny_model_dir), rows("a", max_turns=99)
    for reward, expected in (("sum", 1.5), ("last", 0.5)):
        agent = SkyRLGymAgent(EveryTurnPays, max_turns=3, max_tokens=4, reward=reward)
        rollout = OpenAIAgent(agent, timeout=60).generate(
            policy, [data[0]["prompt"]], 2, SamplingConfig(max_completion_length=60), greedy=True, columns=columns(data)
        )
        assert rollout.columns["agent_reward"] == [expected, expected]
        assert rollout.metrics["turns/mean"] == 3


def test_training_on_a_local_skyrl_gym_environment(tiny_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(["apple", "berry", "cherry", "date"])))
    engine = OpenAIAgent(SkyRLGymAgent("lightning-grpo-say-word", max_tokens=6), timeout=60)
    settings = dict(reward_funcs=[agent_reward], accuracy_reward=None, sampling={"max_completion_length": 18})
    module = make_module(tiny_model_dir, rollout_engine=engine, **settings)
    trainer = fit(module, PromptDataModule(str(data), batch_size=2, val_size=0), tmp_path, max_steps=2)
    metrics = logged(trainer)
    assert len(metrics["train/rewards/agent_reward/mean"]) == 2
    assert metrics["train/turns/mean"] == [3.0, 3.0]  # a random model misses: the environment asks again
    assert metrics["train/agents/errors"] == [0.0, 0.0]


def test_skyrl_gym_s_own_gsm8k_scores_a_skyrl_train_row():
    """skyrl-gym's registered ``gsm8k`` through the adapter, on a row in skyrl-train's format (no model: a scripted
    client answers)."""

    class Client:
        def __init__(self, text: str) -> None:
            self.chat = self.completions = self
            self.text = text

        def create(self, **request):
            from openai.types.chat import ChatCompletion

            message = {"role": "assistant", "content": self.text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return ChatCompletion(id="x", object="chat.completion", created=0, model="m", choices=[choice])

    row = {"prompt": [{"role": "user", "content": "2+2?"}], "env_class": "gsm8k", "reward_spec": {"ground_truth": "4"}}
    assert SkyRLGymAgent()(Client("so #### 4"), row) == 1.0
    assert SkyRLGymAgent()(Client("so #### 5"), row) == 0.0


def test_bad_settings_are_refused_before_any_compute():
    with pytest.raises(ValueError, match="'no-such-env' is not a registered SkyRL-gym environment.*gsm8k"):
        SkyRLGymAgent("no-such-env")
    with pytest.raises(ValueError, match="reward must be one of"):
        SkyRLGymAgent("gsm8k", reward="mean")
    with pytest.raises(ValueError, match="max_turns must be an integer >= 1, got 0"):
        SkyRLGymAgent("gsm8k", max_turns=0)
    with pytest.raises(ValueError, match="no 'env_class' column"):
        SkyRLGymAgent().make({"prompt": []})
