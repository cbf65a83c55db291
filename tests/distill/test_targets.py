"""On-policy distillation end to end on the tiny model: the teacher beside the policy (model/teacher.py), its
log-probs once per generation batch and the mixed advantages (distill/targets.py), GKD's term in the update, the
``distill:`` settings and the ``train/distill/*`` metrics."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from helpers import KeepRollouts, fit, free_port, logged, make_module

from lightning_grpo import AdvantageConfig, PromptDataModule, SamplingConfig, UpdateConfig
from lightning_grpo.cli.report import panels, write_report
from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.distill.config import DistillConfig
from lightning_grpo.distill.loss import generalized_jsd_loss
from lightning_grpo.distill.targets import distill_targets, off_policy_step
from lightning_grpo.engines import AsyncRollouts, LeanDecode
from lightning_grpo.engines.decode.sampling import sampling_logits
from lightning_grpo.loss import LossNormalizer
from lightning_grpo.model.logprobs import completion_logps
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.served_teacher import TeacherServerError
from lightning_grpo.model.teacher import TeacherModel
from lightning_grpo.ranks import Ranks
from lightning_grpo.seeding import seeded
from lightning_grpo.targets import TargetSettings, build_targets
from lightning_grpo.types import PromptBatch, RewardScores, Rollout
from tests.test_docs import METRICS_TABLE, metric_patterns


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """Another tiny Qwen2 of the same tokenizer, other weights (seed 1), its logits 8x sharper than a fresh
    model's near-uniform ones (the final norm's scale): a teacher far from the student."""
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = build_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=1)
    model.model.norm.weight.data *= 8
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def rollout_of(policy: Policy, n: int = 4, width: int = 5) -> Rollout:
    """Sampled completions of two prompts, as the engines build them."""
    with policy.generating():
        tok = policy.tokenizer(["1+2=", "3+1="], return_tensors="pt", padding=True)
        out = policy.model.generate(
            **tok, max_new_tokens=width, do_sample=True, num_return_sequences=n // 2, pad_token_id=tok.input_ids[0, 0]
        )
    prompt = tok.input_ids.repeat_interleave(n // 2, 0)
    completion = out[:, prompt.shape[1] :]
    mask = torch.ones_like(completion)
    return Rollout(
        prompt_ids=prompt,
        prompt_mask=tok.attention_mask.repeat_interleave(n // 2, 0),
        completion_ids=completion,
        completion_mask=mask,
        is_truncated=torch.zeros(n, dtype=torch.bool),
        prompts=["1+2="] * (n // 2) + ["3+1="] * (n // 2),
        completions=[""] * n,
        group_size=n // 2,
    )


def one_rank() -> Ranks:
    return Ranks(L.Trainer(accelerator="cpu", devices=1, logger=False))


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    build_tiny_qwen2(tokenizer, seed=1).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has another tokenizer than the student .* not supported"):
        Policy(tiny_model_dir, teacher=TeacherModel(str(tmp_path)))


def test_the_teacher_is_frozen_and_left_out_of_checkpoints(tiny_model_dir, teacher_dir):
    policy = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir))
    assert not any(p.requires_grad for p in policy.teacher.parameters())
    assert all(p.requires_grad for p in policy.trainable_parameters())
    assert not any(k.startswith("teacher.") for k in policy.state_dict())
    policy.load_state_dict(policy.state_dict())  # strict: the teacher is filled back in, as the reference is
    assert sum(p.numel() for p in policy.trainable_parameters()) == sum(p.numel() for p in policy.model.parameters())


def test_teacher_logps_are_the_teachers_own(tiny_model_dir, teacher_dir):
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir)).train()
    rollout = rollout_of(policy)
    ours = policy.teacher_logps(rollout, [slice(0, 2), slice(2, 4)])  # [4, T]
    alone = Policy(teacher_dir).model.eval()
    width = rollout.completion_ids.shape[1]
    theirs = completion_logps(alone, rollout.input_ids, rollout.attention_mask, width).logps
    torch.testing.assert_close(ours, theirs)
    assert policy.teacher.training  # only switched to eval for its forward (Lightning warns about eval modules)


def test_the_student_as_its_own_teacher_has_no_signal(tiny_model_dir):
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, teacher=TeacherModel(tiny_model_dir))
    rollout = rollout_of(policy)
    mask = rollout.completion_mask.float()
    d = distill_targets(policy, rollout, mask, [slice(None)], None, DistillConfig(teacher="same"), one_rank())
    assert d.advantages.abs().max() < 1e-5 and abs(d.stats.reverse_kl) < 1e-6 and d.stats.tokens == mask.numel()


def test_gkd_term_equals_trls_loss_on_the_same_logits_value_and_gradient(tiny_model_dir, teacher_dir):
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir))
    rollout = rollout_of(policy)
    mask = rollout.completion_mask.float()
    mask[0, 3:] = 0  # a completion that ended early
    config = DistillConfig(teacher="t", objective="gkd", beta=0.3, temperature=0.8)
    d = distill_targets(policy, rollout, mask, [slice(None)], None, config, one_rank())
    ours = d.loss(policy, rollout, slice(None), mask, LossNormalizer.from_mask(mask))
    ours.backward()
    our_grad = [p.grad.clone() for p in policy.model.parameters()]
    policy.model.zero_grad()
    student, teacher = policy.distill_logits(rollout, slice(None))
    labels = torch.where(mask.bool(), rollout.completion_ids, -100)
    theirs = generalized_jsd_loss(student, teacher, labels, beta=0.3, temperature=0.8)  # equal to TRL's
    theirs.backward()
    torch.testing.assert_close(ours, theirs)
    for a, p in zip(our_grad, policy.model.parameters()):
        torch.testing.assert_close(a, p.grad)
    assert 0 < float(d.compared) == mask.sum() and 0 <= float(d.agreeing) <= float(d.compared)


def test_distillation_alone_with_no_reward_functions_runs_on_the_teachers_signal(
    tiny_model_dir, teacher_dir, arith_jsonl, tmp_path
):
    distill = {"teacher": teacher_dir, "reward_weight": 0.0}
    module = make_module(tiny_model_dir, reward_funcs=None, accuracy_reward=None, distill=distill)
    assert [f.__name__ for f in module.rewards.funcs] == ["no_reward"]
    before = [p.detach().clone() for p in module.policy.model.parameters()]
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=3)
    metrics = logged(trainer)
    assert len(metrics["train/distill/reverse_kl"]) == 3 and min(metrics["train/distill/reverse_kl"]) > 0.5
    assert min(metrics["train/distill/reverse_kl_std"]) > 0 and set(metrics["train/reward"]) == {0.0}
    moved = [not torch.equal(a, b) for a, b in zip(before, module.policy.model.parameters())]
    assert all(moved)  # rewards all 0: every step's gradient is the teacher's
    assert all(
        torch.equal(a, b)
        for a, b in zip(module.policy.teacher.state_dict().values(), Policy(teacher_dir).model.state_dict().values())
    )


def test_gkd_mixed_with_rewards_logs_the_top_token_agreement(tiny_model_dir, teacher_dir, arith_jsonl, tmp_path):
    distill = {"teacher": teacher_dir, "objective": "gkd", "teacher_weight": 0.5, "beta": 0.5}
    module = make_module(tiny_model_dir, distill=distill)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2)
    metrics = logged(trainer)
    assert len(metrics["train/distill/top_agreement"]) == 2
    assert all(0 <= a <= 1 for a in metrics["train/distill/top_agreement"])
    assert "train/reward" in metrics
    patterns = metric_patterns(METRICS_TABLE.read_text())
    undocumented = [k for k in metrics if k.startswith("train/") and not any(p.fullmatch(k) for p in patterns)]
    assert not undocumented, f"add these to references/metrics.md: {undocumented}"
    report = write_report(trainer.logger.log_dir)  # lightning-grpo report: the distillation panels appear
    titles = [title for title, _, _ in panels(report.series)]
    assert titles[-2:] == ["Distillation: reverse KL to the teacher", "Distillation: top-token agreement (gkd)"]
    assert report.png.exists() and not any(t.startswith("Distillation") for t, _, _ in panels({}))


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("objective", "fkl", r"distill.objective must be one of \['gkd', 'reverse_kl'\], got 'fkl'"),
        ("lmbda", 0.5, "distill.lmbda 0.5 < 1 .* Needs objective gkd and reward_weight 0, got objective 'reverse_kl'"),
        ("lmbda", 1.5, r"distill.lmbda must be in \[0, 1\], got 1.5"),
        ("beta", 2.0, r"distill.beta must be in \[0, 1\], got 2.0"),
        ("reward_weight", -1.0, "distill.reward_weight must be >= 0, got -1.0"),
        ("objective", "gkd", "distill.objective 'gkd' needs the teacher's whole vocabulary .* reverse_kl"),
    ],
)
def test_bad_distill_settings_are_refused_by_name(option, value, message):
    server = {"teacher_server": "http://127.0.0.1:1"} if value == "gkd" else {}
    with pytest.raises(ValueError, match=message):
        DistillConfig(teacher="t", **{option: value}, **server)


def test_a_teacher_server_without_its_name_or_at_another_temperature_is_refused_before_loading(tiny_model_dir):
    with pytest.raises(ValueError, match="distill.teacher_server 'http://h:1' needs distill.teacher"):
        DistillConfig(teacher_server="http://h:1")
    distill = {"teacher": tiny_model_dir, "teacher_server": "http://127.0.0.1:1"}
    with pytest.raises(ValueError, match="scores at temperature 1 .* sampling.temperature is 0.7"):
        make_module(tiny_model_dir, distill=distill, sampling={"temperature": 0.7})


def test_a_teacher_server_that_does_not_answer_is_named_at_construction(tiny_model_dir):
    url = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on
    with pytest.raises(TeacherServerError, match=f"distill.teacher_server '{url}' does not answer /v1/models"):
        make_module(tiny_model_dir, distill={"teacher": tiny_model_dir, "teacher_server": url})


def test_gkd_s_off_policy_share_is_a_coin_of_the_step_alone():
    config = DistillConfig(teacher="t", objective="gkd", reward_weight=0.0, lmbda=0.3)
    batch = PromptBatch(["1+2="], {"completion": ["3"]})
    flips = [off_policy_step(config, 0, step, batch) for step in range(1000)]
    assert 0.65 < sum(flips) / 1000 < 0.75  # 1 - lmbda of the steps, as TRL's random.random() >= lmbda
    assert flips == [off_policy_step(config, 0, step, batch) for step in range(1000)]  # every rank, every resume
    on_policy = DistillConfig(teacher="t", objective="gkd", reward_weight=0.0, lmbda=1.0)
    assert not any(off_policy_step(on_policy, 0, step, PromptBatch(["1+2="])) for step in range(100))
    with pytest.raises(ValueError, match="no column 'completion' .* its columns: \\['answer'\\]"):
        off_policy_step(config, 0, 0, PromptBatch(["1+2="], {"answer": ["3"]}))


def test_gkd_with_lmbda_0_trains_on_the_dataset_s_completions(tiny_model_dir, teacher_dir, tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b), "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    distill = {"teacher": teacher_dir, "objective": "gkd", "reward_weight": 0.0, "lmbda": 0.0}
    module, kept = make_module(tiny_model_dir, distill=distill), KeepRollouts()
    before = [p.detach().clone() for p in module.policy.model.parameters()]
    fit(module, data(str(tmp_path / "train.jsonl")), tmp_path, max_steps=2, callbacks=[kept])
    eos = module.policy.eos_token_ids[0]
    for rollout in kept.rollouts:
        for prompt, ids, mask in zip(rollout.prompts, rollout.completion_ids, rollout.completion_mask):
            a, b = prompt[:-1].split("+")
            answer = module.policy.tokenizer(str(int(a) + int(b)), add_special_tokens=False).input_ids + [eos]
            assert ids[mask.bool()].tolist() == answer  # the dataset's answer, not a sample
    assert any(not torch.equal(a, b) for a, b in zip(before, module.policy.model.parameters()))  # GKD's term trained


def test_an_off_policy_share_with_an_engine_that_samples_ahead_is_refused(tiny_model_dir):
    distill = {"teacher": tiny_model_dir, "objective": "gkd", "reward_weight": 0.0, "lmbda": 0.5}
    with pytest.raises(ValueError, match="distill.lmbda 0.5 < 1 with an engine that samples ahead .AsyncRollouts, 1"):
        make_module(tiny_model_dir, distill=distill, rollout_engine=AsyncRollouts(max_staleness=1))


@pytest.mark.parametrize("reward_funcs", [None, "default"])
def test_filter_groups_beside_a_teacher_is_refused_before_loading(tiny_model_dir, reward_funcs):
    # filter_groups judges groups by the rewards' spread: the teacher alone (every reward 0) would never make a step,
    # and beside rewards it would drop groups that carry the teacher's per-token signal. The teacher path does not
    # exist: the refusal comes before anything is loaded.
    rewards = {} if reward_funcs else {"reward_funcs": None, "accuracy_reward": None}
    distill = {"teacher": "no/such-teacher", "reward_weight": 0.0 if reward_funcs is None else 1.0}
    message = (
        r"advantages.filter_groups=True drops the groups whose rewards are all equal, but distill.teacher "
        r"'no/such-teacher' \(distill.teacher_weight 1.0\) .* Set advantages.filter_groups=False .* "
        r"or distill.teacher_weight=0"
    )
    with pytest.raises(ValueError, match=message):
        make_module(tiny_model_dir, advantages={"filter_groups": True}, distill=distill, **rewards)
    make_module(
        tiny_model_dir, advantages={"filter_groups": True}, distill={"teacher": tiny_model_dir, "teacher_weight": 0.0}
    )


def processed_logps(policy: Policy, rollout: Rollout, sampling) -> torch.Tensor:
    """[N, T] what vLLM's ``processed_logprobs`` report for each sampled token: its log-prob after the sampling
    filters, renormalised over the mass they kept."""
    width = rollout.completion_ids.shape[1]
    with policy.generating() as model:
        logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits[:, -width - 1 : -1]
    scores = sampling_logits(logits.float().flatten(0, 1), sampling, greedy=False).view(logits.shape)
    picked = scores.log_softmax(-1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    return picked * rollout.completion_mask


def test_with_the_correction_off_a_filtering_sampler_s_log_probs_do_not_stand_in_for_the_student_s(
    tiny_model_dir, teacher_dir
):
    # sampled with top_k 3: vLLM's processed log-probs are log p - log(kept mass) on each token. Before, they were
    # taken as the student's with update.sampling_correction None (nothing checks them then), so each reverse-KL
    # advantage moved by the log of the kept mass.
    torch.manual_seed(0)
    policy = Policy(tiny_model_dir, teacher=TeacherModel(teacher_dir))
    sampling = SamplingConfig(max_completion_length=6, top_k=3)
    with seeded(0, policy.device):
        rollout = LeanDecode().generate(policy, ["1+2=", "3+0="], 4, sampling, False)
    rollout.sampling_logps = processed_logps(policy, rollout, sampling)
    mask = rollout.completion_mask.float()
    own = policy.logps(rollout, [slice(None)])  # [N, T] the trainer's log-probs: unfiltered
    assert ((own - rollout.sampling_logps) * mask).min() < -0.05  # the filter's shift is there to be taken
    scores = RewardScores(torch.zeros(8, 1), ["r"], torch.ones(1))
    config = DistillConfig(teacher=teacher_dir, reward_weight=0.0)
    s = TargetSettings(UpdateConfig(sampling_correction=None), AdvantageConfig(), 4, 6, False, distill=config)
    targets = build_targets(policy, rollout, scores, scores.per_function, s, one_rank())
    teacher = policy.teacher_logps(rollout, [slice(None)])
    torch.testing.assert_close(targets.advantages, -(own - teacher) * mask)
