"""Real Trainer.fit runs of GRPOModule on a tiny Qwen2 loaded with from_pretrained."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import lightning as L
import pytest
import torch
from helpers import ROOT, fit, logged, make_module
from transformers import AutoModelForCausalLM

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks import HFExport, RunSummary
from lightning_grpo.rewards import exact_match_reward

TRL_METRICS = [
    "reward",
    "reward_std",
    "rewards/exact_match_reward/mean",
    "rewards/exact_match_reward/std",
    "rewards/length_reward/mean",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "num_tokens",
    "step_time",
    "loss",
]


def test_fit_updates_the_policy_and_logs_every_metric(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, loss={"beta": 0.1})
    before = {k: v.clone() for k, v in module.policy.model.state_dict().items()}
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=3)
    assert trainer.global_step == 3
    changed = [k for k, v in module.policy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) > len(before) // 2
    metrics = logged(trainer)
    for name in TRL_METRICS:
        assert len(metrics.get(f"train/{name}", [])) == 3, name
    assert metrics["train/kl"][-1] > 0  # the policy moved away from the frozen reference
    assert metrics["train/num_tokens"][0] < metrics["train/num_tokens"][-1]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_micro_batches_give_the_same_update(tiny_model_dir, arith_jsonl, tmp_path, loss_type):
    params = []
    splits = [
        {},  # 16 completions in one pass
        {"update": {"micro_batch_size": 3}},  # passes of 3, 3, 3, 3, 3, 1
        {"update": {"micro_batch_tokens": 60}},  # rows sorted by length, ~60 padded tokens a pass
        {"update": {"micro_batch_tokens": 60}, "policy": {"padding_free": True}},  # each pass packed
    ]
    for split in splits:
        module = make_module(
            tiny_model_dir,
            **split,
            optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
            loss={"loss_type": loss_type},
            optim={"max_grad_norm": None},
        )  # update = gradient, unnormalised
        fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=1)
        params.append(torch.cat([p.detach().flatten() for p in module.policy.model.parameters()]))
    for other in params[1:]:
        assert torch.allclose(params[0], other, atol=1e-6)


def test_the_entropy_threshold_is_the_optimiser_steps_whatever_the_micro_batches(tiny_model_dir, arith_jsonl, tmp_path):
    # top_entropy_quantile 0.2 trains the step's top 20% of tokens by entropy, and the bonus is their mean entropy:
    # with passes of 3 completions, a threshold per pass would keep each pass's own top 20% (another update)
    params = []
    for split in ({}, {"update": {"micro_batch_size": 3}}):
        module = make_module(
            tiny_model_dir,
            **split,
            optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
            loss={"top_entropy_quantile": 0.2, "entropy_coef": 0.1},
            optim={"max_grad_norm": None},
        )
        fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=1)
        params.append(torch.cat([p.detach().flatten() for p in module.policy.model.parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-6)


def test_num_iterations_reuses_a_generation_batch(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, update={"num_iterations": 3}, loss={"epsilon": 0.01})
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=6)
    assert trainer.global_step == 6 and trainer.fit_loop.total_batch_idx + 1 == 2  # 2 batches x 3 steps
    # later iterations see a policy that moved: ratios leave [0.99, 1.01] and get clipped
    assert max(logged(trainer)["train/clip_ratio/region_mean"]) > 0


def test_reference_stays_frozen_and_out_of_checkpoints(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, loss={"beta": 0.05})
    ref_before = {k: v.clone() for k, v in module.policy.reference.state_dict().items()}
    trainer = fit(
        module,
        PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
        tmp_path,
        enable_checkpointing=True,
    )
    assert all(torch.equal(v, ref_before[k]) for k, v in module.policy.reference.state_dict().items())
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    assert ckpt["state_dict"] and not any("reference" in k for k in ckpt["state_dict"])
    assert all(k.startswith("policy.") for k in ckpt["state_dict"])
    optimized = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert not any(id(p) in optimized for p in module.policy.reference.parameters())


def test_validation_export_summary_and_resume(tiny_model_dir, arith_jsonl, tmp_path):
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)
    module = make_module(tiny_model_dir)
    summary, export = RunSummary(), HFExport()
    trainer = fit(
        module,
        data,
        tmp_path,
        max_steps=4,
        enable_checkpointing=True,
        limit_val_batches=None,
        num_sanity_val_steps=-1,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        callbacks=[summary, export],
    )
    metrics = logged(trainer)
    assert len(metrics["val/accuracy"]) == 2 and "val/rewards/length_reward/mean" in metrics
    saved = json.loads(summary.path.read_text())
    assert saved["steps"] == 4 and saved["accuracy_before"] is not None and saved["accuracy_after"] is not None

    exported = AutoModelForCausalLM.from_pretrained(export.path)
    for (name, a), b in zip(exported.state_dict().items(), module.policy.model.state_dict().values()):
        assert torch.equal(a, b), name

    resumed, whole = make_module(tiny_model_dir), RunSummary()
    trainer2 = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[whole],
    )
    trainer2.fit(resumed, data, ckpt_path=trainer.checkpoint_callback.best_model_path)
    assert trainer2.global_step == 6
    assert resumed.counters.num_tokens_seen > module.counters.num_tokens_seen
    resumed_wall = json.loads(whole.path.read_text())["wall_time_s"]  # the whole run's, not the resumed part's
    # the summary rounds to 0.1 s: two resumed steps can take less, so the rounded totals may be equal
    assert whole.earlier > 0 and resumed_wall >= max(saved["wall_time_s"], round(whole.earlier, 1)), resumed_wall


def test_trl_reward_functions_work_unchanged(tiny_model_dir, tmp_path):
    from trl.rewards import accuracy_reward, think_format_reward

    path = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}?"}], "solution": f"${2 * a}$"} for a in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    module = GRPOModule(
        model=tiny_model_dir,
        reward_funcs=[think_format_reward, accuracy_reward],
        num_generations=2,
        sampling={"max_completion_length": 6},
    )
    trainer = fit(module, PromptDataModule(str(path), batch_size=2, val_split=None), tmp_path)
    metrics = logged(trainer)
    assert len(metrics["train/rewards/think_format_reward/mean"]) == 2
    assert len(metrics["train/rewards/accuracy_reward/mean"]) == 2


def test_reward_errors_can_be_skipped_and_counted(tiny_model_dir, arith_jsonl, tmp_path):
    def flaky_reward(completions, **kwargs):
        if any(len(c) > 4 for c in completions):
            raise ValueError("too long to grade")
        return [0.0] * len(completions)

    module = make_module(
        tiny_model_dir,
        reward_funcs=[exact_match_reward, flaky_reward],
        accuracy_reward=None,
        reward_calls={"on_error": "skip"},
    )
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path)
    assert trainer.global_step == 2
    assert max(logged(trainer)["train/reward_errors/flaky_reward"]) > 0


def test_non_finite_steps_are_skipped_then_abort_with_a_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    def infinite_reward(completions, **kwargs):
        return [float("inf")] * len(completions)

    module = make_module(tiny_model_dir, reward_funcs=[infinite_reward], accuracy_reward=None, max_bad_steps=3)
    before = [p.detach().clone() for p in module.policy.model.parameters()]
    with pytest.raises(
        FloatingPointError, match=r"3 GRPO steps in a row skipped \(rewards are infinite\).* checkpoint at"
    ):
        fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=10)
    assert all(torch.equal(a, b) for a, b in zip(before, module.policy.model.parameters()))  # no step was taken
    assert not module.optimizers().optimizer.state  # the optimiser never stepped (its moments untouched)
    assert module.counters.skipped_steps == 3
    assert list(tmp_path.rglob("numerical-abort.ckpt"))


def test_export_refuses_to_overwrite_before_training(tiny_model_dir, arith_jsonl, tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    module = make_module(tiny_model_dir)
    before = [p.detach().clone() for p in module.policy.model.parameters()]
    with pytest.raises(FileExistsError, match="export.dirpath .* already holds files: .* export.overwrite: true"):
        fit(
            module,
            PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
            tmp_path,
            callbacks=[HFExport(dirpath=str(target))],
        )
    assert all(torch.equal(a, b) for a, b in zip(before, module.policy.model.parameters()))
    assert (target / "config.json").read_text() == "{}"
    fit(
        module,
        PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
        tmp_path,
        callbacks=[HFExport(dirpath=str(target), overwrite=True)],
    )
    assert AutoModelForCausalLM.from_pretrained(target) is not None


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, arith_jsonl, tmp_path):
    """Activations recomputed in backward (off while generating, so sampling keeps its KV cache)."""
    modules = []
    for checkpointing in (False, True):
        policy = {"gradient_checkpointing": checkpointing, "share_prompt_prefix": False}  # one forward layout
        module = make_module(tiny_model_dir, policy=policy, loss={"beta": 0.1})
        fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path / str(checkpointing))
        modules.append(module)
    assert modules[1].policy.model.is_activation_checkpointing and modules[1].policy.model.training
    for a, b in zip(modules[0].policy.model.parameters(), modules[1].policy.model.parameters()):
        torch.testing.assert_close(a, b)
    fresh = make_module(tiny_model_dir)
    embeddings = modules[0].policy.model.model.embed_tokens.weight, fresh.policy.model.model.embed_tokens.weight
    assert not torch.equal(*embeddings)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_precisions_train_on_cpu(tiny_model_dir, arith_jsonl, tmp_path, precision):
    """bf16 autocast and bf16 weights train on CPU (log-probs and the softmax stay in fp32). fp16 AMP is GPU-only:
    Lightning switches ``16-mixed`` to ``bf16-mixed`` on CPU with a warning saying so."""
    module = make_module(tiny_model_dir, loss={"beta": 0.1})
    before = module.policy.model.model.embed_tokens.weight.detach().float().clone()
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, precision=precision)
    metrics = logged(trainer)
    assert all(torch.isfinite(torch.tensor(metrics["train/loss"])))
    assert not torch.equal(module.policy.model.model.embed_tokens.weight.detach().float(), before)


def test_sample_outside_a_trainer(tiny_model_dir):
    """``module.sample`` works on a module that is not attached to a Trainer (notebooks, evaluation)."""
    rollout = make_module(tiny_model_dir).sample(["1+2=", "3+0="], num_generations=3)
    assert len(rollout) == 6 and rollout.group_size == 3 and len(rollout.completions) == 6


def test_weight_decay_spares_biases_norms_and_embeddings(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, optim={"weight_decay": 0.1})
    trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=1)
    names = {id(p): n for n, p in module.policy.model.named_parameters()}
    decay = {g["weight_decay"]: [names[id(p)] for p in g["params"]] for g in trainer.optimizers[0].param_groups}
    assert set(decay) == {0.1, 0.0}
    assert all(n.endswith("proj.weight") for n in decay[0.1])  # attention and MLP matrices only
    spared = decay[0.0]
    assert any("norm" in n for n in spared) and any(n.endswith("bias") for n in spared)
    assert "model.embed_tokens.weight" in spared


def test_trainer_test_and_predict(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "data").mkdir()
    for split, part in (("train", rows[:12]), ("test", rows[12:])):
        (tmp_path / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    data = PromptDataModule(str(tmp_path / "data"), batch_size=4)
    module = make_module(tiny_model_dir)
    trainer = fit(module, data, tmp_path, max_steps=1)
    [scores] = trainer.test(module, datamodule=data, verbose=False)
    assert {"test/reward", "test/accuracy", "test/rewards/exact_match_reward/mean"} <= set(scores)
    predictions = [row for batch in trainer.predict(module, datamodule=data) for row in batch]
    assert [p["prompt"] for p in predictions] == [r["prompt"] for r in rows[12:]]
    assert all(isinstance(p["completion"], str) for p in predictions)


def test_test_without_a_test_split_names_the_setting(tiny_model_dir, arith_jsonl, tmp_path):
    data = PromptDataModule(arith_jsonl, batch_size=4)
    module = make_module(tiny_model_dir)
    trainer = fit(module, data, tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="test_split 'test' cannot be read from dataset .* set data.test_split"):
        trainer.test(module, datamodule=data, verbose=False)
    assert len([row for batch in trainer.predict(module, datamodule=data) for row in batch]) == 1  # validation rows


EXPORT_INTO_MOUNT = """
import sys
from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import HFExport
from tests.helpers import fit, make_module

model_dir, data, target, logs = sys.argv[1:]
module = make_module(model_dir)
export = HFExport(dirpath=target, overwrite=True)
fit(module, PromptDataModule(data, batch_size=4, val_split=None), logs, max_steps=1, callbacks=[export])
"""


def can_bind_mount(tmp_path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    command = ["unshare", "-m", "--propagation", "private", "mount", "--bind", str(probe), str(probe)]
    return shutil.which("unshare") is not None and subprocess.run(command, capture_output=True).returncode == 0


def test_an_export_into_a_mount_point_writes_into_it_file_by_file(tiny_model_dir, arith_jsonl, tmp_path):
    """``export.dirpath`` is itself a mounted volume (a bind mount in a private mount namespace): it cannot be
    removed or renamed, so the export writes into it; an earlier export's file it does not write is removed."""
    if not can_bind_mount(tmp_path):
        pytest.skip("no mount namespace here (unshare -m needs root or user namespaces)")
    target = tmp_path / "models"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model-00002-of-00002.safetensors").write_text("an earlier export's")
    script = f"mount --bind {target} {target} && {sys.executable} -c '{EXPORT_INTO_MOUNT}' " + " ".join(
        [tiny_model_dir, arith_jsonl, str(target), str(tmp_path / "logs")]
    )
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert AutoModelForCausalLM.from_pretrained(target) is not None
    assert sorted(p.name for p in target.iterdir() if p.name.startswith((".", "model-"))) == []
