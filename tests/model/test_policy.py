"""model/policy.py: the Policy owns its reference, the strategy dispatch, gradient clipping, the MoE term and
TR-DPO; model/config.py: the policy: settings check themselves."""

import lightning as L
import pytest
import torch

from lightning_grpo import PolicyConfig
from lightning_grpo.engines import HFGenerate
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy
from lightning_grpo.seeding import seeded


def test_the_reference_runs_without_dropout_and_leaves_no_module_in_eval_mode(tiny_model_dir):
    """Lightning warns about modules in eval mode at fit start; the reference only switches for its forward."""
    policy = Policy(tiny_model_dir, reference=True).train()
    modes = []
    policy.reference.get_decoder().register_forward_hook(lambda module, args, out: modes.append(module.training))
    rollout = HFGenerate().generate(policy, ["1+1="], 2, SamplingConfig(max_completion_length=4), greedy=False)
    policy.reference_logps(rollout, [slice(0, 2)])
    # two calls (the shared prompt, then the completions), both in eval mode
    assert modes and set(modes) == {False} and policy.reference.training and policy.model.training


def test_clip_gradients_returns_the_norm_before_clipping(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    for p in policy.trainable_parameters():
        p.grad = torch.ones_like(p)
    count = sum(p.numel() for p in policy.trainable_parameters())
    norm = policy.clip_gradients(1.0, L.Trainer(accelerator="cpu", logger=False).strategy)
    assert norm.item() == pytest.approx(count**0.5, rel=1e-5)  # sqrt of the sum of ones: before clipping
    after = torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]).norm()
    assert after.item() == pytest.approx(1.0, rel=1e-4)


def test_a_dense_model_adds_no_router_loss(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    with seeded(0, policy.device):
        rollout = HFGenerate().generate(policy, ["1+1="], 2, SamplingConfig(max_completion_length=3), greedy=False)
    token = policy.train_logps(rollout, slice(None))
    assert policy.router_aux_coef == 0 and token.aux_loss is None and policy.aux_loss(token, 2) == 0.0


def test_tr_dpo_mixes_the_policy_into_the_reference_every_n_steps(tiny_model_dir):
    config = PolicyConfig(sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.25)
    policy = Policy(tiny_model_dir, config, reference=True)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(1.0)
    before = [r.clone() for r in policy.reference.parameters()]
    policy.after_optimizer_step(1)  # not a multiple of 2: untouched
    assert all(torch.equal(a, b) for a, b in zip(before, policy.reference.parameters()))
    policy.after_optimizer_step(2)  # ref = 0.25 * policy + 0.75 * ref = ref + 0.25
    for a, b in zip(before, policy.reference.parameters()):
        torch.testing.assert_close(b, a + 0.25)


def test_sync_ref_model_without_a_reference_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="policy.sync_ref_model=True updates a reference copy: it needs loss.beta > 0"):
        Policy(tiny_model_dir, PolicyConfig(sync_ref_model=True))


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"dtype": "fp8"}, "policy.dtype must be one of"),
        ({"logprob_chunk_size": 0}, "policy.logprob_chunk_size must be None or >= 1, got 0"),
        ({"ref_model_mixup_alpha": 1.5}, "policy.ref_model_mixup_alpha must be in [0, 1], got 1.5"),
        (
            {"sync_ref_model": True, "peft_config": {"r": 4}},
            "with a peft_config the reference is the adapter switched off",
        ),
    ],
)
def test_policy_settings_check_themselves(settings, message):
    with pytest.raises(ValueError) as err:
        PolicyConfig(**settings)
    assert message in str(err.value)


def test_a_copy_without_models_shares_the_tokenizer_and_holds_no_model_or_reference(tiny_model_dir):
    policy = Policy(tiny_model_dir, reference=True)
    clone = policy.without_models()
    assert clone.model is None and clone.reference is None and clone.tokenizer is policy.tokenizer
    clone.model = torch.nn.Linear(1, 1)  # what the sampling process does with its own copy of the weights
    assert policy.model is not clone.model and policy.reference is not None


def test_the_shared_prompt_forward_is_on_by_default_where_exact(tiny_model_dir):
    assert Policy(tiny_model_dir).shares_prompt_prefix
    assert not Policy(tiny_model_dir, PolicyConfig(gradient_checkpointing=True)).shares_prompt_prefix
    assert not Policy(tiny_model_dir, PolicyConfig(share_prompt_prefix=False)).shares_prompt_prefix
    windowed = Policy(tiny_model_dir)
    windowed.model.config.layer_types = ["sliding_attention"] * windowed.model.config.num_hidden_layers
    assert not windowed.shares_prompt_prefix  # a sliding window would drop prompt keys the plain forward reads


def test_the_default_engine_is_lean_decode_unless_generate_options_are_given(caplog):
    from lightning_grpo.engines import LeanDecode, default_engine

    assert type(default_engine(SamplingConfig())) is LeanDecode
    assert type(default_engine({"max_completion_length": 8})) is LeanDecode
    with caplog.at_level("INFO"):
        fallback = default_engine({"generation_kwargs": {"no_repeat_ngram_size": 2}})
    assert type(fallback) is HFGenerate
    assert "rollout engine: HFGenerate, as sampling.generation_kwargs={'no_repeat_ngram_size': 2}" in caplog.text
