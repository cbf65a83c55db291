"""Multi-process runs on CPU (gloo): DDP equals one process on the same global batch; FSDP2 equals DDP, with and
without LoRA, and built on the meta device equals loading whole models; FSDP2 resumes exactly from a distributed
checkpoint; 2 nodes x 1 process equal 1 node x 2."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import MULTIPROCESS, free_port, run_ranks

SCRIPT = MULTIPROCESS / "parallel_run.py"


def run(mode: str, model_dir: str, data: str, out: Path, *args: str, name: str = "") -> list[dict]:
    name = name or mode
    ranks = 1 if mode.startswith("replay") else 2
    return run_ranks("parallel_run.py", [model_dir, data, str(out / name), mode, *args], out / name, ranks)


def assert_same_run(expected: list[dict], ranks: list[dict]) -> None:
    """Two 2-rank, 3-step runs sampled the same completions on each rank, logged the same step metrics (within
    1e-5) and ended with the same weights (rank 0's gathered)."""
    for rank in (0, 1):
        for step in range(3):
            a, b = expected[rank]["steps"][step], ranks[rank]["steps"][step]
            assert a["rollout"].completions == b["rollout"].completions
            for key in ("loss", "reward", "kl", "entropy"):
                assert b["metrics"][key] == pytest.approx(a["metrics"][key], abs=1e-5), (rank, step, key)
    torch.testing.assert_close(ranks[0]["params"], expected[0]["params"], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def ddp(tiny_model_dir, arith_jsonl, tmp_path_factory):
    out = tmp_path_factory.mktemp("parallel")
    return out, run("ddp", tiny_model_dir, arith_jsonl, out)


@pytest.mark.slow
def test_ddp_equals_one_process_on_the_same_global_batch(ddp, tiny_model_dir, arith_jsonl):
    out, ranks = ddp
    (single,) = run("replay", tiny_model_dir, arith_jsonl, out)
    assert single["global_step"] == ranks[0]["global_step"] == 3
    for step in range(3):
        for key in ("loss", "reward", "reward_std", "kl", "entropy", "completions/mean_length"):
            # metrics are of the global batch on every rank: equal to the single process's
            assert ranks[0]["steps"][step]["metrics"][key] == pytest.approx(ranks[1]["steps"][step]["metrics"][key])
            expected = ranks[0]["steps"][step]["metrics"][key]
            assert single["steps"][step]["metrics"][key] == pytest.approx(expected, rel=1e-5, abs=1e-7), key
        torch.testing.assert_close(single["grads"][step], ranks[0]["grads"][step], rtol=1e-4, atol=1e-6)
        assert ranks[0]["grads"][step].abs().sum() > 0  # there was something to compare
    torch.testing.assert_close(single["params"], ranks[0]["params"], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_matches_ddp(ddp, tiny_model_dir, arith_jsonl):
    out, ddp_ranks = ddp
    fsdp_ranks = run("fsdp2", tiny_model_dir, arith_jsonl, out)
    torch.testing.assert_close(fsdp_ranks[0]["params"], fsdp_ranks[1]["params"])  # the gathered full weights
    assert_same_run(ddp_ranks, fsdp_ranks)  # sharded generation samples the same


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2+prefix", "ddp+prefix", "fsdp2+packed+tokens", "fsdp2+packed+prefix"])
def test_a_shared_prompt_prefix_matches_ddp_without_it(ddp, tiny_model_dir, arith_jsonl, mode):
    # Prefix Grouper under FSDP2 (each layer gathered around each of its two calls) and DDP, packed rows
    # (padding_free) in token-budget micro-batches and packed with the shared prompt: the plain values
    out, ddp_ranks = ddp
    ranks = run(mode, tiny_model_dir, arith_jsonl, out)
    assert_same_run(ddp_ranks, ranks)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="Lightning's fsdp strategy (FSDP1) needs 2 CUDA GPUs")
def test_fsdp1_on_gpus_keeps_ranks_in_step(tiny_model_dir, arith_jsonl, tmp_path):
    """Generation with every rank in step (synced_gpus) and identical gathered weights after 3 steps."""
    ranks = run("fsdp1", tiny_model_dir, arith_jsonl, tmp_path)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 3
    for step in range(3):
        assert ranks[0]["steps"][step]["metrics"]["reward"] == ranks[1]["steps"][step]["metrics"]["reward"]
    assert ranks[0]["params"].isfinite().all()


@pytest.mark.slow
def test_fsdp2_with_lora_matches_ddp_with_lora(tiny_model_dir, arith_jsonl, tmp_path):
    """The frozen base sharded, the adapter trained, the adapter-off reference, the merged export gathered."""
    from transformers import AutoModelForCausalLM

    ddp_ranks = run("ddp+lora", tiny_model_dir, arith_jsonl, tmp_path)
    fsdp_ranks = run("fsdp2+lora", tiny_model_dir, arith_jsonl, tmp_path)
    for rank in (0, 1):
        for step in range(3):
            a, b = ddp_ranks[rank]["steps"][step], fsdp_ranks[rank]["steps"][step]
            assert a["rollout"].completions == b["rollout"].completions
            for key in ("loss", "reward", "kl", "entropy"):
                assert b["metrics"][key] == pytest.approx(a["metrics"][key], abs=1e-5), (rank, step, key)
            torch.testing.assert_close(fsdp_ranks[rank]["grads"][step], ddp_ranks[rank]["grads"][step])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert fsdp_ranks[0]["grads"][0].numel() < sum(v.numel() for v in base.values()) / 10  # only the adapter
    assert ddp_ranks[0]["steps"][0]["metrics"]["kl"] == 0.0 < ddp_ranks[0]["steps"][2]["metrics"]["kl"]
    torch.testing.assert_close(fsdp_ranks[0]["params"], ddp_ranks[0]["params"], rtol=1e-4, atol=1e-5)
    merged = [
        AutoModelForCausalLM.from_pretrained(tmp_path / mode / "hf" / "merged") for mode in ("ddp+lora", "fsdp2+lora")
    ]
    assert merged[1].lm_head.weight is merged[1].model.embed_tokens.weight  # still tied, as the base is
    for name, weight in merged[0].state_dict().items():
        torch.testing.assert_close(merged[1].state_dict()[name], weight, rtol=1e-4, atol=1e-6, msg=name)
    assert any(not torch.equal(w, base[n]) for n, w in merged[1].state_dict().items())  # the adapter was merged


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["", "+lora"])
def test_fsdp2_meta_device_init_equals_loading_whole_models(lora, tiny_model_dir, arith_jsonl, tmp_path):
    """Built under ``trainer.init_module(empty_init=True)``: no weights until each rank reads its own shard, then
    the same run to the bit (the reference for beta > 0, and a LoRA adapter drawn as PEFT draws it)."""
    whole = run("fsdp2" + lora, tiny_model_dir, arith_jsonl, tmp_path)
    meta = run("fsdp2meta" + lora, tiny_model_dir, arith_jsonl, tmp_path)
    assert meta[0]["built_on_meta"] and not whole[0]["built_on_meta"]
    for rank in (0, 1):
        torch.testing.assert_close(meta[rank]["start"], whole[rank]["start"], rtol=0, atol=0)
        for step in range(3):
            a, b = whole[rank]["steps"][step], meta[rank]["steps"][step]
            assert a["rollout"].completions == b["rollout"].completions
            assert b["metrics"]["kl"] == a["metrics"]["kl"], (rank, step)  # the reference was loaded too
            torch.testing.assert_close(meta[rank]["grads"][step], whole[rank]["grads"][step], rtol=0, atol=0)
        torch.testing.assert_close(meta[rank]["params"], whole[rank]["params"], rtol=0, atol=0)
    assert whole[0]["steps"][2]["metrics"]["kl"] > 0  # the policy moved away from the reference
    assert not torch.equal(meta[0]["params"], meta[0]["start"])


@pytest.mark.slow
def test_fsdp2_sharded_checkpoint_resume_equals_the_uninterrupted_run(tiny_model_dir, arith_jsonl, tmp_path):
    """4 steps in one go equal 2 steps, a distributed checkpoint (each rank writes its shard), and 2 more steps
    resumed from it: weights, AdamW state, schedule, counters. The frozen reference is not in the checkpoint.
    The checkpoint exports to Hugging Face format a tensor at a time, in files of at most 100 kB here."""
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from lightning_grpo.model.export import export_distributed_checkpoint

    data = arith_jsonl  # 16 shuffled prompts, 2 per rank: the stop falls mid-epoch
    full = run("fsdp2", tiny_model_dir, data, tmp_path, "4", name="full")
    first = run("fsdp2", tiny_model_dir, data, tmp_path, "4", "2", name="first")
    ckpt = tmp_path / "first" / "last.ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    keys = FileSystemReader(ckpt).read_metadata().state_dict_metadata
    assert any(k.startswith("optimizer_0.state.") for k in keys) and not any("reference" in k for k in keys)
    resumed = run("fsdp2", tiny_model_dir, data, tmp_path, "4", "0", str(ckpt), name="resumed")
    assert first[0]["global_step"] == 2 and resumed[0]["global_step"] == full[0]["global_step"] == 4
    for rank in (0, 1):
        torch.testing.assert_close(resumed[rank]["start"], first[rank]["params"], rtol=0, atol=0)
        for step in (2, 3):
            a, b = full[rank]["steps"][step], resumed[rank]["steps"][step - 2]
            assert a["rollout"].prompts == b["rollout"].prompts
            assert a["rollout"].completions == b["rollout"].completions
            for key in ("loss", "reward", "kl", "entropy", "lr", "num_tokens"):
                assert b["metrics"][key] == pytest.approx(a["metrics"][key], abs=1e-6), (rank, step, key)
        torch.testing.assert_close(resumed[rank]["params"], full[rank]["params"], rtol=0, atol=1e-6)

    exported = export_distributed_checkpoint(ckpt, tmp_path / "hf", max_shard_bytes=100_000)
    assert len(list(exported.glob("model-*-of-*.safetensors"))) > 1
    model = AutoModelForCausalLM.from_pretrained(exported)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(params, first[0]["params"], rtol=0, atol=0)


@pytest.mark.slow
def test_ddp_resumed_mid_epoch_sees_the_same_prompts_in_the_same_order(tiny_model_dir, arith_jsonl, tmp_path):
    """6 steps in one go equal 3 steps, a checkpoint, and 3 more resumed from it, on 2 ranks: 16 shuffled prompts,
    2 per rank and step, so the stop falls mid-epoch and the resumed run crosses into the next epoch. Each rank
    continues its own share of the same permutation (the data module's DistributedSampler, seed and epoch)."""
    full = run("ddp", tiny_model_dir, arith_jsonl, tmp_path, "6", name="full")
    first = run("ddp", tiny_model_dir, arith_jsonl, tmp_path, "6", "3", name="first")
    ckpt = str(tmp_path / "first" / "last.ckpt")
    resumed = run("ddp", tiny_model_dir, arith_jsonl, tmp_path, "6", "0", ckpt, name="resumed")
    prompts = [[[s["rollout"].prompts for s in r["steps"]] for r in ranks] for ranks in (full, first, resumed)]
    for rank in (0, 1):
        assert prompts[1][rank] + prompts[2][rank] == prompts[0][rank]
        rewards = [s["metrics"]["reward"] for s in resumed[rank]["steps"]]
        assert rewards == pytest.approx([s["metrics"]["reward"] for s in full[rank]["steps"][3:]], abs=1e-6)
        torch.testing.assert_close(resumed[rank]["params"], full[rank]["params"], rtol=0, atol=1e-6)
    # the first epoch (4 steps): each rank's 8 prompts, the two shares disjoint: the 16 prompts once each
    epoch = [set(sum(prompts[0][rank][:4], [])) for rank in (0, 1)]
    assert len(epoch[0]) == len(epoch[1]) == 8 and epoch[0].isdisjoint(epoch[1])


@pytest.mark.slow
def test_two_nodes_equal_one_node_with_two_processes(ddp, tiny_model_dir, arith_jsonl):
    """Two torchrun "nodes" (1 process each, one rendezvous on 127.0.0.1) train as 1 node x 2 processes does."""
    out, one_node = ddp
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    rendezvous = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    script = [str(SCRIPT), tiny_model_dir, arith_jsonl, str(out / "nodes"), "nodes"]
    nodes = [
        subprocess.Popen([*torchrun, "--node-rank", str(n), *rendezvous, *script], stderr=subprocess.PIPE, text=True)
        for n in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    two_nodes = [torch.load(out / "nodes" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for rank in (0, 1):  # node n holds global rank n: the same rank, seed and data shard as process n of one node
        for step in range(3):
            a, b = one_node[rank]["steps"][step], two_nodes[rank]["steps"][step]
            assert a["rollout"].completions == b["rollout"].completions
            for key in ("loss", "reward", "reward_std", "kl", "entropy", "num_tokens"):
                assert b["metrics"][key] == pytest.approx(a["metrics"][key], abs=1e-6), (rank, step, key)
            torch.testing.assert_close(two_nodes[rank]["grads"][step], one_node[rank]["grads"][step])
        torch.testing.assert_close(two_nodes[rank]["params"], one_node[rank]["params"], rtol=0, atol=1e-6)
