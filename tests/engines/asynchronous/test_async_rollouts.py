"""AsyncRollouts: a producer process samples ahead of the trainer; k = 0 equals the synchronous path, k >= 1 trains
on rollouts at most k updates old with the sampling correction, and checkpoints keep the queue."""

from __future__ import annotations

import copy
import os
import traceback
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module, run_ranks

from lightning_grpo.callbacks import PreemptionCheckpoint
from lightning_grpo.cli.failure import failure_message
from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import AsyncRollouts
from lightning_grpo.targets.correction import sampling_correction
from lightning_grpo.types import step_record
from tests.callbacks.test_preemption import SendSignal
from tests.test_groups import signal_on_even_sums

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def data(arith_jsonl):
    return PromptDataModule(arith_jsonl, batch_size=4, val_split=None)  # 16 rows: 4 steps per epoch


def weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.policy.model.parameters()]


def test_k0_updates_equal_the_synchronous_path(tiny_model_dir, arith_jsonl, tmp_path):
    # the producer process samples each step's batch from the step's RNG state and the weights of that step
    sync = make_module(tiny_model_dir)
    fit(sync, data(arith_jsonl), tmp_path / "sync", max_steps=3)
    k0 = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=0))
    trainer = fit(k0, data(arith_jsonl), tmp_path / "k0", max_steps=3)
    for a, b in zip(weights(sync), weights(k0)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert logged(trainer)["train/async/staleness/max"] == [0.0, 0.0, 0.0]
    assert k0.engine.process is None  # ended with the fit


@pytest.mark.parametrize("correction", ["auto", "sequence_mask"])
def test_k1_trains_one_step_behind_with_the_correction(tiny_model_dir, arith_jsonl, tmp_path, correction):
    update = {"sampling_correction": correction}
    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1), update=update)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=3)
    metrics = logged(trainer)
    assert trainer.global_step == 3
    # the first batch only filled the pipeline; after it, every batch was sampled one update earlier
    assert metrics["train/async/staleness/max"] == [0.0, 1.0, 1.0]
    gap = metrics["train/sampling/kl"]  # the producer's log-probs ride every rollout, and the gap is measured
    assert len(gap) == 3 and gap[0] == pytest.approx(0.0, abs=1e-6) and min(gap[1:]) > 1e-6  # fresh, then stale
    weighted = "train/sampling/importance_sampling_ratio/mean" in metrics
    if correction == "auto":  # an engine sampling ahead: the loss's clip is anchored at the sampler, no weight
        assert module.settings.update.sampling_correction == "bypass" and not weighted
    else:
        ratios = metrics["train/sampling/importance_sampling_ratio/mean"]
        assert ratios[0] == pytest.approx(1.0, abs=1e-5) and ratios[1:] != [1.0, 1.0]
    assert module.engine.version == 3


def test_bounds_with_auto_under_async_are_refused_before_the_model_loads():
    from lightning_grpo import GRPOModule

    with pytest.raises(ValueError, match=r"'auto' is 'bypass' for an engine sampling up to 2 update\(s\) ahead"):
        GRPOModule(
            model="/nonexistent/never/loaded",
            rollout_engine=AsyncRollouts(max_staleness=2),
            update={"sampling_correction_max": 2.0},
        )


def test_stale_importance_weights_by_hand():
    # batch sampled by version t - 1 with token log-probs [-1.2, -0.7]; the proximal policy (version t) gives
    # [-1.0, -0.9]. Per token: e^0.2 = 1.2214, e^-0.2 = 0.8187; per sequence the shifts cancel: e^0 = 1.
    proximal, sampler, mask = torch.tensor([[-1.0, -0.9]]), torch.tensor([[-1.2, -0.7]]), torch.ones(1, 2)
    token = sampling_correction(proximal, sampler, mask, "token_truncate", clip_max=3.0)
    torch.testing.assert_close(token, torch.tensor([[1.2214, 0.8187]]), atol=1e-4, rtol=0)
    assert sampling_correction(proximal, sampler, mask, "sequence_mask").item() == 1.0
    # a completion whose log-prob rose by 1.5 since it was sampled: e^1.5 = 4.48 > 3, masked out of the loss
    assert sampling_correction(torch.tensor([[-0.5]]), torch.tensor([[-2.0]]), torch.ones(1, 1)).item() == 0.0


def test_the_mailbox_moves_only_the_trained_weights():
    """Under LoRA an update changes the adapter alone: publish needs and copies only it, take copies only it."""
    import multiprocessing as mp

    from torch import nn

    from lightning_grpo.engines.asynchronous.producer import WeightsMailbox, trained_names

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)  # the frozen base
    assert trained_names(model) == ["1.weight", "1.bias"]
    mailbox = WeightsMailbox(model, mp.get_context("spawn"))
    private = copy.deepcopy(model)
    new = {name: torch.full_like(t, 7.0) for name, t in model.state_dict().items() if name.startswith("1.")}
    assert mailbox.publish(new) == 1  # the frozen weights' keys are not needed
    assert mailbox.take(private, have=0) == 1
    assert torch.equal(private[1].weight, torch.full((2, 3), 7.0)) and torch.equal(
        private[1].bias, torch.full((2,), 7.0)
    )
    torch.testing.assert_close(private[0].weight, model[0].weight, rtol=0, atol=0)  # untouched, still equal


class StaleWeights(L.Callback):
    """Recomputes, independently of the engine, the log-probs of each step's rollout under the weights that
    sampled it (version t - 1) and under the step's own (version t), and the weights they make."""

    def __init__(self) -> None:
        self.versions: dict[int, list[torch.Tensor]] = {}
        self.checked: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.versions[trainer.global_step] = weights(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if step_record(outputs) is None or trainer.global_step < 2:
            return
        rollout, step = step_record(outputs).rollout, trainer.global_step - 1  # the step that just trained
        sampled = logps_with(pl_module, self.versions[step - 1], rollout)  # [N, T]
        proximal = logps_with(pl_module, self.versions[step], rollout)
        torch.testing.assert_close(rollout.sampling_logps, sampled, atol=1e-4, rtol=0)  # the producer's own
        mask = rollout.completion_mask.bool()
        rho = ((proximal - sampled) * mask).sum(1).exp()  # [N] sequence-level, as sequence_mask takes it
        rho = torch.where(rho > 3.0, 0.0, rho)
        expected = rho.unsqueeze(1).expand_as(mask)[mask].mean().item()
        self.checked.append((expected, trainer.callback_metrics["train/sampling/importance_sampling_ratio/mean"]))


def logps_with(module, params: list[torch.Tensor], rollout) -> torch.Tensor:
    model = copy.deepcopy(module.policy.model)
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(value)
    return module.policy.token_logps(rollout, slice(None), model=model.eval()).logps.detach()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_k1_importance_weights_are_the_ratio_to_the_sampling_version(tiny_model_dir, arith_jsonl, tmp_path, lora):
    """With a LoRA policy too: the adapter's weights reach the producer (its log-probs are the sampling version's)."""
    settings = {"policy": {"peft_config": LORA}} if lora else {}
    update = {"sampling_correction": "sequence_mask"}  # the default under async, bypass, applies no weight
    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1), update=update, **settings)
    check = StaleWeights()
    fit(module, data(arith_jsonl), tmp_path, max_steps=3, callbacks=[check])
    assert len(check.checked) == 2
    for expected, logged_mean in check.checked:
        assert abs(expected - float(logged_mean)) < 1e-4
        assert expected != 1.0  # the weights moved between sampling and training: a real correction


@pytest.mark.slow
@pytest.mark.parametrize("case", ["trainer_scores", "producer_scores", "filter_groups"])
def test_resume_after_sigterm_continues_exactly(tiny_model_dir, arith_jsonl, tmp_path, case):
    # the checkpoint keeps the rollout sampled ahead (awaited at save), so the resumed run trains on it; its
    # producer scores are not kept: the resumed trainer scores it again. With filter_groups, the groups carried
    # to the next update are kept too.
    filtering = {"reward_funcs": [signal_on_even_sums], "accuracy_reward": None, "advantages": {"filter_groups": True}}

    def run(name, **kw):
        engine = AsyncRollouts(max_staleness=1, score_in_producer=case == "producer_scores")
        module = make_module(tiny_model_dir, rollout_engine=engine, **(filtering if case == "filter_groups" else {}))
        updates = Updates()
        kw["callbacks"] = [updates, *kw.get("callbacks", [])]
        fit(module, data(arith_jsonl), tmp_path / name, max_steps=4, **kw)
        return module, updates.metrics

    full, reference = run("full")
    stop = 2  # the update after which the run is preempted; with filter_groups, the first that carried groups
    if case == "filter_groups":
        stop = 1 + next(i for i, m in enumerate(reference) if m["filter_groups/carried_groups"] > 0)
        assert stop < 4
    with pytest.raises(SystemExit):
        run("first", callbacks=[SendSignal(at=stop - 1), PreemptionCheckpoint()])
    ckpt = tmp_path / "first" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == stop and len(saved["rollout_engine"]["ranks"][0]["ready"]) == 1
    if case == "filter_groups":  # groups with signal waiting for the next update: restored, not lost
        assert saved["group_buffer"]["ranks"][0]["rollout"] is not None
    resumed, second = run("second", ckpt_path=ckpt)
    for a, b in zip(weights(full), weights(resumed)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert len(second) == 4 - stop
    for expected, got in zip(reference[stop:], second):  # the updates after the stop
        for key in ("reward", "async/staleness/max", "sampling/kl"):
            assert expected[key] == pytest.approx(got[key], abs=1e-6), key


class Updates(L.Callback):
    """Each update's metrics, as its record has them."""

    def __init__(self):
        self.metrics = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if step_record(outputs):  # none while the pipeline fills or filter_groups waits
            self.metrics.append(step_record(outputs).stats.metrics())


def async_run(tmp_path: Path, name: str, *args: str) -> list[dict]:
    """``async_ddp_run.py``'s two ranks' records of one run in ``tmp_path / name``."""
    out = tmp_path / name
    return run_ranks("async_ddp_run.py", [*args[:2], str(out), *args[2:]], out)


@pytest.mark.slow
@pytest.mark.parametrize("scoring", ["trainer", "producer"])
def test_two_process_ddp_async_run(tiny_model_dir, arith_jsonl, tmp_path, scoring):
    ranks = async_run(tmp_path, "ddp", tiny_model_dir, arith_jsonl, scoring)
    assert ranks[0]["param_head"] == ranks[1]["param_head"]  # gradients all-reduced, weights equal
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 3
    for a, b in zip(ranks[0]["seen"], ranks[1]["seen"]):
        assert a["completions"] != b["completions"]  # each rank's producer: own prompts, own seed
    assert [s["staleness"] for s in ranks[0]["seen"]] == [0.0, 1.0, 1.0]  # the first batch: version 0 at update 0
    for rank in ranks:  # each rank's own producer scored its own batch: the rewards are of its completions
        for seen in rank["seen"]:
            assert seen["producer_scored"] == (scoring == "producer")
            assert seen["rewards"] == pytest.approx([len(c) / 8 for c in seen["completions"]])
    queues = torch.load(tmp_path / "ddp" / "last.ckpt", weights_only=False)["rollout_engine"]["ranks"]
    assert [len(q["ready"]) for q in queues] == [1, 1]  # both ranks' rollouts sampled ahead are in the checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["", "+lora"], ids=["full", "lora"])
def test_fsdp2_async_run_equals_ddp(tiny_model_dir, arith_jsonl, tmp_path, lora):
    """A sharded policy's producers sample from its gathered weights: each rank's completions and sampler
    log-probs at every step (one of them sampled after an update) equal the DDP run's, and so do the weights."""
    ddp = async_run(tmp_path, "ddp", tiny_model_dir, arith_jsonl, "trainer", "ddp" + lora)
    fsdp2 = async_run(tmp_path, "fsdp2", tiny_model_dir, arith_jsonl, "trainer", "fsdp2" + lora)
    for a, b in zip(ddp, fsdp2):
        assert [s["staleness"] for s in b["seen"]] == [0.0, 1.0, 1.0]
        assert [s["completions"] for s in a["seen"]] == [s["completions"] for s in b["seen"]]
        sampler = [s["sampler_logps"] for s in b["seen"]]
        assert sampler == pytest.approx([s["sampler_logps"] for s in a["seen"]], abs=1e-4)
        assert b["param_head"] == pytest.approx(a["param_head"], abs=1e-6)
    meta = torch.load(tmp_path / "fsdp2" / "last.ckpt" / "meta.pt", weights_only=False)  # a distributed checkpoint
    assert [len(q["ready"]) for q in meta["rollout_engine"]["ranks"]] == [1, 1]
    if lora:
        return
    # preempted after update 2, then resumed from its distributed checkpoint: the last update as the whole run's
    async_run(tmp_path, "first", tiny_model_dir, arith_jsonl, "trainer", "fsdp2", "2")
    ckpt = str(tmp_path / "first" / "stop.ckpt")
    resumed = async_run(tmp_path, "second", tiny_model_dir, arith_jsonl, "trainer", "fsdp2", "0", ckpt)
    for whole, second in zip(fsdp2, resumed):
        assert second["global_step"] == 3 and second["seen"] == whole["seen"][2:]
        assert second["param_head"] == pytest.approx(whole["param_head"], abs=1e-6)


async def answer_column_reward(prompts, completions, answer, **kwargs):
    """An async reward reading a dataset column: the column must be the rollout's own batch's, not the step's."""
    assert all(str(int(p[0]) + int(p[2])) == a for p, a in zip(prompts, answer)), "columns of another batch"
    return [0.0] * len(completions)  # no signal of its own: which groups have one is signal_on_even_sums' call


@pytest.mark.slow
@pytest.mark.parametrize("in_producer", [False, True], ids=["trainer_scores", "producer_scores"])
def test_k1_with_filter_groups_and_an_async_reward(tiny_model_dir, arith_jsonl, tmp_path, in_producer):
    module = make_module(
        tiny_model_dir,
        reward_funcs=[signal_on_even_sums, answer_column_reward],
        accuracy_reward=None,
        advantages={"filter_groups": True},
        rollout_engine=AsyncRollouts(max_staleness=1, score_in_producer=in_producer),
    )
    records = []

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if step_record(outputs):
                records.append(step_record(outputs))

    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=4, callbacks=[Keep()])
    assert trainer.global_step == 4 and len(records) == 4
    for version, record in enumerate(records):  # update i trains version i
        assert len(record.rollout) == 4 * 4 and record.stats.rewards.frac_zero_std == 0.0  # groups with signal
        assert all((int(p[0]) + int(p[2])) % 2 == 0 for p in record.rollout.prompts)
        staleness = version - record.rollout.versions
        metrics = record.stats.metrics()
        assert metrics["async/staleness/max"] == staleness.max().item() <= 1  # of the rows trained on, carried too
        assert metrics["async/staleness/mean"] == pytest.approx(staleness.float().mean().item())
    carried = logged(trainer)["train/filter_groups/carried_groups"]
    assert sum(carried) > 0  # surplus groups with signal kept for the next update, within the bound


class ProcessReward:
    """Exact match on the ``answer`` column; its ``metrics()`` say which process scored (a counter the run logs)."""

    __name__ = "process_reward"

    def __call__(self, completions, answer, **kwargs):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    def metrics(self):
        return {"scored_in_pid": float(os.getpid())}


def failing_reward(completions, **kwargs):
    raise ValueError("no score today")


def test_scoring_in_the_producer_trains_as_scoring_in_the_trainer(tiny_model_dir, arith_jsonl, tmp_path):
    """The same updates whichever process scores; with score_in_producer the producer did (its pid is logged)."""
    runs = {}
    for in_producer in (False, True):
        engine = AsyncRollouts(max_staleness=1, score_in_producer=in_producer)
        module = make_module(
            tiny_model_dir, reward_funcs=[ProcessReward()], accuracy_reward=None, rollout_engine=engine
        )
        trainer = fit(module, data(arith_jsonl), tmp_path / str(in_producer), max_steps=3)
        runs[in_producer] = module, logged(trainer)
    for a, b in zip(weights(runs[False][0]), weights(runs[True][0])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    by_trainer, by_producer = runs[False][1], runs[True][1]
    assert by_trainer["train/reward"] == by_producer["train/reward"]
    assert set(by_trainer["train/scored_in_pid"]) == {float(os.getpid())}
    assert os.getpid() not in by_producer["train/scored_in_pid"] and len(set(by_producer["train/scored_in_pid"])) == 1
    assert "train/async/scoring_s" in by_producer and "train/async/scoring_s" not in by_trainer


def test_scoring_in_the_producer_refuses_a_reward_it_cannot_pickle(tiny_model_dir, arith_jsonl, tmp_path):
    def local_reward(completions, **kwargs):  # a closure: pickle cannot send it to another process
        return [0.0] * len(completions)

    engine = AsyncRollouts(max_staleness=1, score_in_producer=True)
    module = make_module(tiny_model_dir, reward_funcs=[local_reward], accuracy_reward=None, rollout_engine=engine)
    with pytest.raises(ValueError) as err:
        fit(module, data(arith_jsonl), tmp_path, max_steps=1)
    assert "reward function 'local_reward' cannot be pickled" in str(err.value)
    assert "set score_in_producer: false" in str(err.value)
    assert engine.process is None  # refused before any sampling


@pytest.mark.parametrize("in_producer", [False, True])
def test_a_reward_failing_in_the_producer_reads_as_it_does_in_process(
    tiny_model_dir, arith_jsonl, tmp_path, in_producer
):
    """Issue 59 item 7: the producer's error printed its raw traceback in the CLI's one-line message; now the same
    message as in-process, the producer's traceback only as the cause (what LIGHTNING_GRPO_DEBUG=1 prints)."""
    engine = AsyncRollouts(max_staleness=1, score_in_producer=in_producer)
    module = make_module(tiny_model_dir, reward_funcs=[failing_reward], accuracy_reward=None, rollout_engine=engine)
    with pytest.raises(RuntimeError) as err:
        fit(module, data(arith_jsonl), tmp_path, max_steps=2)
    message = failure_message(err.value, ["fit"])
    assert message.startswith(
        "lightning-grpo: error: RuntimeError: reward function 'failing_reward' raised ValueError on sample 0"
    )
    assert "no score today" in message and "Traceback" not in message and "producer" not in message
    trace = "".join(traceback.format_exception(err.value))
    assert ("(in the rollout producer)" in trace) == in_producer and "Traceback" in trace


def nan_gradient_at(module, calls: set[int]) -> None:
    """The head's gradient NaN on the given backward calls (1-based): one backward per optimiser step here."""
    seen = [0]

    def hook(grad):
        seen[0] += 1
        return grad * float("nan") if seen[0] in calls else grad

    module.policy.model.get_output_embeddings().weight.register_hook(hook)


def test_an_update_cut_short_by_a_nan_gradient_is_published(tiny_model_dir, arith_jsonl, tmp_path):
    """steps_per_generation 2: the first update's second optimiser step has NaN gradients and is not taken, after
    its first was. The step is skipped, and the weights that step moved are published all the same: the producer
    samples from them and the staleness counts them (before: no sync, version 2 after 3 updates)."""
    module = make_module(
        tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1), update={"steps_per_generation": 2}
    )
    nan_gradient_at(module, {2})
    with pytest.warns(UserWarning, match=r"gradients are infinite or NaN \(after 1 optimiser step\(s\) of the"):
        trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=5)
    assert trainer.global_step == 5  # 1 + 2 + 2 optimiser steps taken over three updates
    assert module.engine.version == 3  # every update that moved the weights was published
    assert logged(trainer)["train/skipped_steps"][-1] == 1.0


def test_the_producer_scores_without_dropout(tiny_model_dir, tmp_path):
    """An engine other than LeanDecode (no log-probs of its own): the producer's forward gives the sampler's
    log-probs, in eval mode, equal to the policy's without dropout (before: train mode, 0.1+ off with
    attention_dropout 0.3)."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.engines import HFGenerate
    from lightning_grpo.engines.asynchronous.producer import Request, sample
    from lightning_grpo.engines.config import SamplingConfig
    from lightning_grpo.model.policy import Policy
    from lightning_grpo.types import PromptBatch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attention_dropout=0.3)
    model.save_pretrained(tmp_path / "dropout")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tiny_model_dir) / name).exists():
            (tmp_path / "dropout" / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    policy = Policy(str(tmp_path / "dropout"))
    policy.model.train()  # as the trainer's copy is when it is published
    batch = PromptBatch(prompts=["max(1,2,3)=", "max(4,5,6)="], columns={})
    request = Request(batch, 0, torch.get_rng_state(), 0, sampling_logps=True)
    rollout = sample(policy, HFGenerate(), SamplingConfig(max_completion_length=8), 2, request)
    policy.model.eval()
    with torch.no_grad():
        expected = policy.logps(rollout, [slice(None)])  # [N, T]
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.sampling_logps[mask], expected[mask], atol=1e-5, rtol=1e-5)


def slow_reward(completions, **kwargs):
    """A reward that takes 2 s a batch: the producer, which scores, is the slow side."""
    import time

    time.sleep(2.0)
    return [len(c) / 8 for c in completions]


def test_the_trainer_s_wait_for_the_producer_to_take_its_weights_is_idle_time(tiny_model_dir, arith_jsonl, tmp_path):
    """k = 2 with a producer slower than the trainer: the trainer waits in sync_weights until the producer has
    taken the weights of every request it was sent, and that wait is idle time, in the next step's
    async/trainer_idle_fraction (before: 0.00 logged while the trainer idled 0.8 s of a 1.0 s step). Each
    sync_weights is timed from outside: the idle time it leaves counted covers it."""
    import time

    engine = AsyncRollouts(max_staleness=2, score_in_producer=True)
    publish, syncs = engine.sync_weights, []

    def timed(policy):
        start = time.perf_counter()
        publish(policy)
        syncs.append((time.perf_counter() - start, engine.waited_s))

    engine.sync_weights = timed
    slow = ["tests.engines.asynchronous.test_async_rollouts.slow_reward"]
    module = make_module(tiny_model_dir, rollout_engine=engine, reward_funcs=slow, accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=3)
    assert max(took for took, _ in syncs) > 0.2, syncs  # the trainer did wait for the producer
    assert all(counted >= 0.9 * took - 0.05 for took, counted in syncs), syncs
    idle = logged(trainer)["train/async/trainer_idle_fraction"]
    assert max(idle[1:]) > 0.1, idle


def test_teardown_lets_go_of_the_engine(tiny_model_dir, arith_jsonl, tmp_path):
    """After the fit, nothing of the engine's is kept alive: its exit hook is unregistered (before: atexit held
    the engine, and through it the trainer, the policy and the shared-memory model, until the interpreter ended)."""
    import gc
    import weakref

    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1))
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=1)
    engine, policy = weakref.ref(module.engine), weakref.ref(module.policy)
    assert module.engine.process is None
    del module, trainer
    gc.collect()
    assert engine() is None and policy() is None
