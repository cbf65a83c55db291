"""OpenEnv environments through ToolCalling: a tiny local OpenEnv environment (``openenv-core``'s own Environment,
Action and Observation classes, in-process) trained on with a real ``Trainer.fit``."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT, fit, logged, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import OpenEnvFactory, ToolCall, ToolCalling, environment_reward
from lightning_grpo.engines.multiturn.calls import tool_schema

interfaces = pytest.importorskip("openenv.core.env_server.interfaces")
types = pytest.importorskip("openenv.core.env_server.types")


class SayAction(types.Action):
    """Say a word."""

    message: str = types.Field(..., description="the word to say")


class WordObservation(types.Observation):
    text: str = ""


class WordEnv(interfaces.Environment):
    """Rewards saying the row's word: 1.0 on the first step if the message is the word, then done."""

    def __init__(self) -> None:
        super().__init__()
        self.word = ""

    def reset(self, word: str = "", **kwargs) -> WordObservation:
        self.word = word
        return WordObservation(text=f" Say {word}.", done=False, reward=0.0)

    def step(self, action: SayAction, **kwargs) -> WordObservation:
        said = action.message.strip()
        return WordObservation(text=f"you said {said!r}", done=True, reward=float(said == self.word))

    @property
    def state(self) -> types.State:
        return types.State()


class SayEveryTurn:
    """The random tiny model writes no calls: the first turn says its own first character, the word's or not."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, [ToolCall("say", {"message": text[:1]})]


def test_the_action_is_a_tool_with_the_action_s_fields():
    environment = OpenEnvFactory(WordEnv, SayAction, tool_name="say")()
    schema = tool_schema(environment.say)["function"]
    assert schema["name"] == "say" and schema["description"] == "Say a word."
    assert schema["parameters"]["properties"]["message"] == {"type": "string", "description": "the word to say"}
    assert environment.reset(word="a", prompt="ignored") == " Say a."
    assert environment.say(message="a") == "you said 'a'" and environment.get_reward() == 1.0
    assert "over" in environment.say(message="a") and environment.get_reward() == 1.0  # done: no more steps


def test_training_on_a_local_openenv_environment(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tmp_path / "model"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(model_dir)
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": "Hi."}], "word": w}) + "\n" for w in "abcd")
    )
    engine = ToolCalling(
        environment_factory=OpenEnvFactory(WordEnv, SayAction, tool_name="say"),
        parser=SayEveryTurn(),
        max_tool_calling_iterations=1,
    )
    module = make_module(str(model_dir), reward_funcs=[environment_reward], accuracy_reward=None, rollout_engine=engine)
    trainer = fit(module, PromptDataModule(str(data), batch_size=2, val_size=0), tmp_path, max_steps=2)
    metrics = logged(trainer)
    assert len(metrics["train/rewards/WordEnv/mean"]) == 2  # the environment's own reward, every step
    assert metrics["train/tools/call_frequency"][0] > 0 and metrics["train/tools/failure_frequency"][0] == 0


def test_the_worked_example_answers_each_guess_with_its_hint_field():
    """demo/guess.py through OpenEnvFactory: reset gets the row's ``answer``, the tool is ``guess(guess: int)`` and
    its reply is the observation's one own field (``hint``); the reward is the summed step rewards."""
    from lightning_grpo.demo.guess import MAX_GUESSES, GuessAction, GuessEnvironment

    environment = OpenEnvFactory(GuessEnvironment, GuessAction, tool_name="guess")()
    schema = tool_schema(environment.guess)["function"]
    assert schema["parameters"]["properties"]["guess"]["type"] == "integer"
    assert environment.reset(answer="222", prompt="ignored") == f" You have {MAX_GUESSES} guesses."
    assert [environment.guess(guess=g) for g in (100, 300, 222)] == ["higher", "lower", "correct"]
    assert environment.get_reward() == 1.0 and "over" in environment.guess(guess=222)
    environment.reset(answer="5")
    assert [environment.guess(guess=1) for _ in range(MAX_GUESSES)] == ["higher"] * MAX_GUESSES
    assert "over" in environment.guess(guess=5) and environment.get_reward() == 0.0  # done after 3 wrong guesses


def test_the_openenv_template_runs(tmp_path, monkeypatch):
    """templates/openenv_cpu.yaml as a user runs it, for 2 steps: the environment's tool is offered and its
    reward logged every step."""

    from lightning_grpo.cli.main import main

    monkeypatch.chdir(tmp_path)
    config = ROOT / "templates" / "openenv_cpu.yaml"
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false"])
    (run,) = tmp_path.glob("runs/openenv_cpu/lightning_logs/*")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/tools/call_frequency" in r]
    assert len(train) == 2 and all("train/rewards/GuessEnvironment/mean" in r for r in train)
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
