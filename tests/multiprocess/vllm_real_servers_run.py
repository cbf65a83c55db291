"""A 2-process DDP (gloo) GRPO run whose completions come from REAL vLLM-CPU servers
(``tests/engines/vllm/test_real_servers_ranks.py`` starts them and the router); each rank writes what it saw to
``OUT/rank<k>.pt``.

``python vllm_real_servers_run.py MODEL DATA OUT URL[,URL] ROUTER|- STEPS LORA(0|1) [OUTAGE_URL [RESTART_AFTER]]``
in the vLLM venv. Every rank sends its own prompts (``seed`` 1000 in ``generation_kwargs``, moved by the rank: rank 0's
requests carry seed 1000, rank 1's 1008, which the servers' request logs show). After every step rank 0 asks each
live server directly for its greedy tokens on the sync probe and checks them against the trained policy
(``policy_side``), outside the engine's own check. With ``OUTAGE_URL`` rank 0 has that server killed after step 1
(it writes ``OUT/kill``; the test, which owns the process, kills it) and restarted after step ``RESTART_AFTER``
(default 2; ``OUT/restart``), and waits each time until it is down, then up: with ``RESTART_AFTER`` 1 the server
is another process by the next step, and no request failed. Lightning's launcher starts rank 1 by re-running this
script.
"""

import sys
import time
from pathlib import Path

import lightning as L
import torch
from quiet_trainer import quiet_trainer  # this script's folder is on the path

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.engines import VLLMServer
from lightning_grpo.engines.vllm.control import ServerControl
from lightning_grpo.engines.vllm.sync import policy_side, probe_prompt

SEED = 1000
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def length_reward(completions, **kwargs):
    """> 0 for every real completion: a failed generation scored as an empty one would be 0."""
    return [len(c) / 8 for c in completions]


class Recorder(L.Callback):
    """Each step's prompts, completions, rewards, metrics; on rank 0 each server's probe against the policy."""

    def __init__(self, engine: VLLMServer) -> None:
        self.engine, self.steps = engine, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        record = outputs["record"]
        step = {
            "prompts": list(batch.prompts),
            "completions": record.rollout.completion_ids.tolist(),
            "rewards": record.scores.total.tolist(),
            "metrics": {**record.stats.metrics(), **record.rollout.metrics},
            "probes": {},
        }
        if trainer.global_rank == 0:  # the weights every server holds now (the push of this step is done)
            prompt = probe_prompt(module.policy)
            for url in [self.engine.urls[i] for i in sorted(self.engine.pool.live)]:
                control = ServerControl(url, url, 60)
                control.model = self.engine.model_name
                tokens, logps = control.probe(prompt)
                check = policy_side(module.policy, prompt, tokens, logps, 1e-3)
                step["probes"][url] = {"ok": check.ok, "logp_error": check.logp_error, "tokens": tokens}
        self.steps.append(step)


class Outage(L.Callback):
    """Rank 0 has the server of ``url`` killed after step 1 and restarted after step ``restart_after`` (files in
    ``out``, which the test watches), and waits until it is down, then until it answers ``/health`` again."""

    def __init__(self, url: str, out: Path, restart_after: int) -> None:
        self.url, self.out, self.restart_after = url, out, restart_after

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank != 0:
            return
        for ask, step, up in (("kill", 1, False), ("restart", self.restart_after, True)):
            if trainer.global_step == step:
                (self.out / ask).touch()
                deadline = time.monotonic() + 300
                while ServerControl(self.url, "", 5).healthy(timeout=2) != up:
                    assert time.monotonic() < deadline, f"{self.url} is not {'up' if up else 'down'} after 300 s"
                    time.sleep(0.5)


def main(model_dir: str, data_path: str, out_dir: str, urls: str, router: str, steps: str, lora: str,
         outage: str = "", restart_after: str = "2") -> None:  # fmt: skip
    torch.set_num_threads(1)
    L.seed_everything(0)
    engine = VLLMServer(
        base_url=urls,
        router_url=None if router == "-" else router,
        weights_dir=str(Path(out_dir) / "weights"),
        connection_timeout=60,
        request_timeout=60,
        max_tries=3,
    )
    module = GRPOModule(
        model=model_dir,
        reward_funcs=[length_reward],
        num_generations=4,
        rollout_engine=engine,
        update={"sampling_correction": "token_truncate"},
        sampling={"max_completion_length": 6, "temperature": 0.9, "generation_kwargs": {"seed": SEED}},
        optim={"learning_rate": 1e-2},
        **({"policy": {"peft_config": LORA}} if lora == "1" else {}),
    )
    recorder = Recorder(engine)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    outages = [Outage(outage, Path(out_dir), int(restart_after))] if outage else []
    trainer = quiet_trainer(out_dir, int(steps), [recorder, *outages])
    trainer.fit(module, PromptDataModule(data_path, batch_size=2, val_split=None))
    state = {k: v.detach().clone() for k, v in module.policy.model.state_dict().items()}
    torch.save({"steps": recorder.steps, "state": state, "global_step": trainer.global_step,
                "model": engine.model_name},
               Path(out_dir) / f"rank{trainer.global_rank}.pt")  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
