"""The GRPO family's module-level options in real Trainer.fit runs on the tiny model: rollout reuse, dynamic
sampling, TR-DPO reference sync, advantage estimators, entropy control, the MoE router loss, pass@k, and
TRL's model and sampling knobs."""

from __future__ import annotations

import typing

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module
from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM

from lightning_grpo import LossConfig, PromptDataModule, SamplingConfig
from lightning_grpo.demo.tiny import build_tokenizer
from lightning_grpo.engines.prompts import render_prompts
from lightning_grpo.loss import LOSS_TYPES
from lightning_grpo.seeding import seeded


def data(path, batch_size=4, **kw):
    return PromptDataModule(path, batch_size=batch_size, val_split=None, **kw)


# ---- rollout reuse: steps_per_generation ------------------------------------------------------------------


def test_steps_per_generation_takes_several_optimiser_steps_per_generation_batch(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(
        tiny_model_dir, update={"steps_per_generation": 2, "num_iterations": 2}, loss={"epsilon": 0.01}
    )
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=8)
    assert trainer.global_step == 8 and trainer.fit_loop.total_batch_idx + 1 == 2  # 2 batches x 2 x 2 steps
    assert max(logged(trainer)["train/clip_ratio/region_mean"]) > 0  # later steps are off-policy and clip


# ---- reference sync (TR-DPO) -----------------------------------------------------------------------------


def test_sync_ref_model_mixes_the_policy_into_the_reference(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(
        tiny_model_dir,
        loss={"beta": 0.1},
        policy={"sync_ref_model": True, "ref_model_sync_steps": 2, "ref_model_mixup_alpha": 0.25},
    )
    mixed = []

    class Watch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            mixed.append([p.detach().clone() for p in pl_module.policy.reference.parameters()])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ref = [p.detach().clone() for p in pl_module.policy.reference.parameters()]
            pol = [p.detach().clone() for p in pl_module.policy.model.parameters()]
            mixed[-1] = (mixed[-1], ref, pol, trainer.global_step)

    fit(module, data(arith_jsonl), tmp_path, max_steps=2, callbacks=[Watch()])
    (before1, after1, _, step1), (before2, after2, policy2, step2) = mixed
    assert step1 == 1 and all(torch.equal(a, b) for a, b in zip(before1, after1))  # not a sync step
    assert step2 == 2
    for old, new, pol in zip(before2, after2, policy2):
        torch.testing.assert_close(new, 0.25 * pol + 0.75 * old)


# ---- advantage estimators, entropy, router loss -----------------------------------------------------------


@pytest.mark.parametrize(
    "advantages,loss",
    [
        ({"adv_estimator": "rloo"}, {}),
        ({"adv_estimator": "reinforce_plus_plus", "kl_coef": 0.05}, {}),
        ({"adv_estimator": "reinforce_plus_plus_baseline"}, {"beta": 0.05}),
        ({"multi_objective_aggregation": "normalize_then_sum"}, {}),
    ],
)
def test_advantage_estimators_train(tiny_model_dir, arith_jsonl, tmp_path, advantages, loss):
    module = make_module(tiny_model_dir, advantages=advantages, loss=loss)
    before = [p.detach().clone() for p in module.policy.model.parameters()]
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2)
    assert module.policy.reference is not None or not (loss or advantages.get("kl_coef"))
    assert all(torch.isfinite(torch.tensor(v)).all() for v in logged(trainer)["train/loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, module.policy.model.parameters()))


def test_adaptive_entropy_moves_its_coefficient_and_is_saved(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(
        tiny_model_dir,
        loss={"use_adaptive_entropy": True, "entropy_coef": 0.1, "entropy_target": 100.0, "entropy_coef_delta": 0.05},
    )
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2, enable_checkpointing=True)
    assert logged(trainer)["train/entropy_coef"] == pytest.approx([0.15, 0.2])  # below target: more bonus
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    assert ckpt["entropy_controller"]["coef"] == pytest.approx(0.2)


def test_top_entropy_quantile_trains(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, loss={"top_entropy_quantile": 0.2})
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=1)
    metrics = logged(trainer)
    assert metrics["train/entropy/trained_mean"][0] > metrics["train/entropy"][0]  # the top 20% by entropy


def tiny_mixtral(tokenizer_dir):
    torch.manual_seed(0)
    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    config = MixtralConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.0,
    )
    return MixtralForCausalLM(config)


def test_router_aux_loss_is_added_for_moe_models(tiny_model_dir, arith_jsonl, tmp_path):
    gates = []
    for coef in (0.0, 10.0):
        module = make_module(
            tiny_mixtral(tiny_model_dir),
            policy={"tokenizer": tiny_model_dir},
            loss={"router_aux_loss_coef": coef},
            optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        )
        fit(module, data(arith_jsonl), tmp_path, max_steps=1)
        gates.append([p.detach().clone() for n, p in module.policy.model.named_parameters() if "gate.weight" in n])
    assert gates[0] and any(not torch.allclose(a, b) for a, b in zip(*gates))  # only the router loss differs


def test_router_aux_loss_coef_needs_an_moe_model(tiny_model_dir):
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.1 needs a Mixture-of-Experts model"):
        make_module(tiny_model_dir, loss={"router_aux_loss_coef": 0.1})


# ---- evaluation: pass@k -----------------------------------------------------------------------------------


def test_num_generations_eval_logs_pass_at_k(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, num_generations_eval=4)
    trainer = fit(
        module,
        PromptDataModule(arith_jsonl, batch_size=4, val_size=4),
        tmp_path,
        max_steps=1,
        limit_val_batches=1.0,
        val_check_interval=1,
        num_sanity_val_steps=0,
    )
    metrics = trainer.callback_metrics
    assert {"val/pass@4", "val/mean@4", "val/accuracy"} <= set(metrics)
    assert metrics["val/pass@4"] >= metrics["val/mean@4"] == metrics["val/accuracy"]


# ---- TRL's model and sampling knobs ------------------------------------------------------------------------


def test_model_init_kwargs_and_disable_dropout(tiny_model_dir):
    module = make_module(
        tiny_model_dir,
        policy={
            "model_init_kwargs": {"attn_implementation": "eager", "attention_dropout": 0.3},
            "disable_dropout": True,
        },
        loss={"beta": 0.1},
    )
    model = module.policy.model
    assert model.config._attn_implementation == "eager"  # passed to from_pretrained
    for m in [*model.modules(), *module.policy.reference.modules()]:
        assert getattr(m, "attention_dropout", 0.0) == 0.0 and getattr(m, "p", 0.0) == 0.0
    with pytest.raises(ValueError, match="use the dtype and load_in_4bit settings"):
        make_module(tiny_model_dir, policy={"model_init_kwargs": {"torch_dtype": "bfloat16"}})


def test_chat_template_kwargs_reach_the_template():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if enable_thinking %}<think>{% endif %}"
    )
    chat = [[{"role": "user", "content": "1+1="}]]
    assert render_prompts(tokenizer, chat, {"enable_thinking": True}) == ["1+1=<think>"]
    assert render_prompts(tokenizer, chat, None) == ["1+1="]


def test_generation_kwargs_reach_the_sampler(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = SamplingConfig(generation_kwargs={"no_repeat_ngram_size": 1}).generation_config(tokenizer)
    assert config.no_repeat_ngram_size == 1
    module = make_module(tiny_model_dir, sampling={"generation_kwargs": {"no_repeat_ngram_size": 1}})
    with seeded(0, module.device):
        rollout = module.sample(["3+4="], num_generations=4)
    for ids, mask in zip(rollout.completion_ids, rollout.completion_mask):
        tokens = ids[mask.bool()].tolist()[:-1]  # a token may only repeat as the final EOS
        assert len(tokens) == len(set(tokens))


# ---- the sections ----------------------------------------------------------------------------------------


def test_loss_type_choices_are_the_registry():
    hints = typing.get_type_hints(LossConfig)
    assert set(typing.get_args(hints["loss_type"])) == set(LOSS_TYPES)
