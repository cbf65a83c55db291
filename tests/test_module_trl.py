"""One whole GRPO step, ours and TRL 1.16's ``GRPOTrainer``, on the same prompts and the same sampled completions:
every parameter moves alike. What a loss-level comparison (``tests/loss/test_grpo_trl.py``) leaves out is covered
here: the prompts' tokenization, the completion mask after the first EOS and on truncated rows, the rewards and the
group's advantages, the loss's normalisation over the step, gradient clipping, the optimiser and its schedule.

Sampling is the one random part, so both sides' ``generate`` is replaced by one that writes fixed completions (per
prompt, in order of the prompt's repeats) after the prompt it is given, as ``generate`` returns them: EOS, then pad.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from helpers import fit, make_module
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_grpo import PromptDataModule
from lightning_grpo.engines import HFGenerate

trl = pytest.importorskip("trl")

PROMPTS = ["1+2=", "13+3="]  # the questions; a chat run asks each as a user message
G, T = 4, 6  # completions a prompt, tokens a completion


def digit_reward(completions, **kwargs):
    """Varies within each group of the completions below: the digits a completion writes (a chat run's: its
    assistant message, TRL's ``[{"role": "assistant", "content": ...}]``)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(sum(ch.isdigit() for ch in text)) for text in texts]


def prompt_rows(chat: bool, steps: int = 1) -> list[dict]:
    """The dataset's rows, both questions a step: plain text, or a conversation the model's chat template writes."""
    return [{"prompt": [{"role": "user", "content": q}] if chat else q} for q in PROMPTS] * steps


def scripted_completions(tokenizer) -> dict[str, list[list[int]]]:
    """G completions of T tokens for each question: some end at an EOS (then pad), one a group runs to T."""
    gen = torch.Generator().manual_seed(0)
    vocab = [tokenizer.encode(ch, add_special_tokens=False)[-1] for ch in "0123456789+="]
    eos = tokenizer.eos_token_id
    pad = eos if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    out = {}
    for p, question in enumerate(PROMPTS):
        rows = []
        for k in range(G):
            ids = [vocab[int(i)] for i in torch.randint(len(vocab), (T,), generator=gen)]
            done = T if k == p else 2 + k  # row p of question p is truncated; the rest stop after 2-5 tokens
            rows.append((ids[:done] + [eos] + [pad] * T)[:T])
        out[question] = rows
    return out


def script_generate(model_dir: str, monkeypatch) -> list[int]:
    """``generate`` of ``model_dir``'s model class, on both sides: the prompt it is given, then that prompt's next
    scripted completion; the list of its calls' row counts."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    completions = scripted_completions(tokenizer)
    model_class = type(AutoModelForCausalLM.from_pretrained(model_dir))
    calls = []

    def generate(self, input_ids, attention_mask, **kwargs):
        calls.append(len(input_ids))
        seen, rows = Counter(), []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            text = tokenizer.decode(ids[mask.bool()])  # the whole prompt: template, system message and question
            (question,) = [q for q in PROMPTS if q in text]
            rows.append(completions[question][seen[question] % G])
            seen[question] += 1
        assert all(n == G for n in seen.values()), seen  # every prompt G times: whole groups
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], 1)

    monkeypatch.setattr(model_class, "generate", generate)
    return calls


@pytest.fixture
def scripted_generate(tiny_model_dir, monkeypatch) -> list[int]:
    return script_generate(tiny_model_dir, monkeypatch)


@dataclass(frozen=True)
class Run:
    """What both sides are given: the loss, the optimiser (``sgd``: plain SGD at lr 0.5 and a constant schedule, one
    step; else each side's default AdamW at 1e-3 and a cosine schedule whose first of two steps is warm-up) and
    gradient clipping at 1.0 or none; ``chat``: the questions as conversations."""

    loss_type: str = "dapo"
    beta: float = 0.0
    sgd: bool = True
    clip: bool = False
    chat: bool = False

    @property
    def lr(self) -> float:
        return 0.5 if self.sgd else 1e-3

    @property
    def steps(self) -> int:
        return 1 if self.sgd else 2


def trl_step(model_dir: str, tmp_path, run: Run) -> dict[str, torch.Tensor]:
    """Parameters after TRL's steps, each one generation batch of both prompts' G completions."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=len(PROMPTS) * G,  # TRL counts completions
        num_generations=G,
        max_completion_length=T,
        steps_per_generation=1,
        learning_rate=run.lr,
        max_grad_norm=1.0 if run.clip else 0.0,  # 0: no clipping; 1.0: transformers' default
        lr_scheduler_type="constant" if run.sgd else "cosine",
        warmup_steps=0.0 if run.sgd else 0.5,  # a ratio: step 1 of 2 is warm-up
        max_steps=run.steps,
        loss_type=run.loss_type,
        beta=run.beta,
        temperature=1.0,
        shuffle_dataset=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    optimizers = (torch.optim.SGD(model.parameters(), lr=run.lr), None) if run.sgd else (None, None)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[digit_reward],
        args=args,
        train_dataset=Dataset.from_list(prompt_rows(run.chat, run.steps)),
        optimizers=optimizers,
    )
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def our_step(model_dir: str, tmp_path, run: Run) -> dict[str, torch.Tensor]:
    """Parameters after our steps, ``Trainer.fit`` over the same two prompts (one batch, an epoch a step)."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in prompt_rows(run.chat)))
    schedule = {"lr_scheduler_type": "constant"} if run.sgd else {"lr_scheduler_type": "cosine", "warmup_ratio": 0.5}
    module = make_module(
        model_dir,
        reward_funcs=[digit_reward],
        accuracy_reward=None,
        rollout_engine=HFGenerate(),  # the engine that calls generate
        num_generations=G,
        sampling={"max_completion_length": T, "temperature": 1.0},
        loss={"loss_type": run.loss_type, "beta": run.beta},
        optim={"learning_rate": run.lr, "max_grad_norm": 1.0 if run.clip else None, **schedule},
        optimizer=(lambda params: torch.optim.SGD(params, lr=run.lr)) if run.sgd else None,
    )
    fit(module, PromptDataModule(str(path), batch_size=len(PROMPTS), val_split=None), tmp_path, run.steps)
    return {n: p.detach().clone() for n, p in module.policy.model.named_parameters()}


def both_steps(model_dir: str, tmp_path, run: Run, calls: list[int]):
    """(each parameter's change on our side, on TRL's), having checked that both trained on the scripted rows."""
    before = {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
    theirs, ours = trl_step(model_dir, tmp_path, run), our_step(model_dir, tmp_path, run)
    assert calls == [len(PROMPTS) * G] * 2 * run.steps  # a call a step a side: both sampled nothing of their own
    assert theirs.keys() == ours.keys() == before.keys()
    return {n: ours[n] - before[n] for n in ours}, {n: theirs[n] - before[n] for n in ours}


def norm(deltas: dict[str, torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.stack([d.norm() for d in deltas.values()])))


@pytest.mark.parametrize(
    "run",
    [Run("dapo"), Run("grpo"), Run("dr_grpo"), Run("bnpo"), Run("dapo", clip=True)],
    ids=["dapo", "grpo", "dr_grpo", "bnpo", "dapo-clipped"],
)
def test_one_sgd_step_moves_every_parameter_as_trl_s(tiny_model_dir, scripted_generate, tmp_path, run):
    """SGD: each parameter's change is its (clipped) gradient times the learning rate, so any difference in the
    rewards, the advantages, the mask, the loss's normaliser or the clipping shows."""
    ours, theirs = both_steps(tiny_model_dir, tmp_path, run, scripted_generate)
    assert sum(bool(d.any()) for d in ours.values()) > len(ours) // 2  # a real step: most parameters moved
    if run.clip:  # the gradient's norm was above 1: both sides cut it to 1, so the step's norm is the rate
        assert norm(ours) == pytest.approx(run.lr, rel=1e-4) and norm(theirs) == pytest.approx(run.lr, rel=1e-4)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-6, msg=name)


def test_two_adamw_steps_with_clipping_a_schedule_and_kl_move_as_trl_s(tiny_model_dir, scripted_generate, tmp_path):
    """Two steps with each side's default optimiser (AdamW, no weight decay), clipping at 1.0, a cosine schedule
    whose first step is warm-up (learning rate 0: only the moments move) and a KL term (beta 0.04): each parameter's
    change within 1e-3 of TRL's in norm. Not elementwise: where a gradient is ~0, AdamW's step is its sign times
    the rate, and the two sides' rounding differs there."""
    ours, theirs = both_steps(tiny_model_dir, tmp_path, Run(beta=0.04, sgd=False, clip=True), scripted_generate)
    entries = sum(d.numel() for d in ours.values())
    assert norm(ours) > 0.5 * 1e-3 * entries**0.5  # most entries moved by about the rate (AdamW's first real step)
    assert_moved_alike(ours, theirs)


def assert_moved_alike(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Each parameter's change within 1e-3 of TRL's, in norm."""
    for name in ours:
        assert (ours[name] - theirs[name]).norm() <= 1e-3 * theirs[name].norm(), name
