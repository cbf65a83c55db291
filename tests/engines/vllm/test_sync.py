"""engines/vllm/sync.py and engines/vllm/lora.py without vLLM: what a push sends (LoRA merged or the base alone,
Hugging Face names, the tied LM head; or the adapter alone as numbered versions) and the check that proves it
arrived, on hand-worked numbers and on the tiny policy itself; ``WeightSync``, the push both vLLM engines share,
into an engine of this process that loads what it is sent (weights by name, adapter folders through PEFT)."""

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lightning_grpo.engines.vllm.lora import AdapterVersions, adapter_rank, check_lora_sync, max_lora_rank
from lightning_grpo.engines.vllm.sync import (
    PROBE_TOKENS,
    SyncCheck,
    Unreachable,
    WeightSync,
    WeightSyncError,
    check_sync,
    inference_weights,
    policy_side,
    probe_prompt,
    weight_bytes,
)
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def check(engine, policy, top, atol=1e-3):
    return SyncCheck([5, 6], torch.tensor(engine), torch.tensor(policy), torch.tensor(top), atol)


def test_engine_equal_to_the_policy_passes_and_reports_its_error():
    assert check_sync("E", 1, check([-0.5, -1.0], [-0.5004, -1.0], [-0.5, -1.0])) == {
        "vllm/sync_logp_error": pytest.approx(4e-4, abs=1e-6)
    }


def test_stale_log_probs_fail_naming_engine_step_and_difference():
    # the tokens are still the policy's top ones, but their log-probs moved by 0.02 > 1e-3: stale weights
    with pytest.raises(
        WeightSyncError,
        match=r"^VLLMColocate does not generate .* step 3: .*differ from the policy's by "
        r"up to 0.02 \(tolerance 0.001\)",
    ):
        check_sync("VLLMColocate", 3, check([-0.52, -1.0], [-0.5, -1.0], [-0.5, -1.0]))


def test_a_sync_check_that_fails_names_the_dtype_to_serve_in():
    """Issue 59 item 2: a bfloat16 server beside a float32 policy failed the check by 0.00908, naming no dtype."""
    with pytest.raises(WeightSyncError, match=r"in the policy's dtype .* serve it with --dtype float32"):
        check_sync("VLLMServer", 1, check([-0.509, -1.0], [-0.5, -1.0], [-0.5, -1.0]))


def test_a_token_the_policy_would_not_pick_fails_at_its_position():
    # position 1: the policy's top log-prob is -0.2, the engine's token has -1.0 under the policy
    with pytest.raises(WeightSyncError, match="its token at position 1 is not the policy's top token"):
        check_sync("E", 1, check([-0.5, -1.0], [-0.5, -1.0], [-0.5, -0.2]))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_pushed_weights_are_the_models_under_hugging_face_names(tiny_model_dir, lora):
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config=LORA if lora else None))
    if lora:  # a trained adapter: B != 0 changes the merged weights
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    weights = inference_weights(policy)
    merged = policy.model.merge_and_unload() if lora else policy.model
    expected = merged.state_dict()
    assert set(weights) == set(expected) | {"lm_head.weight"}  # the tied head listed under its own name
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert weights["lm_head.weight"].data_ptr() != weights["model.embed_tokens.weight"].data_ptr()


def trained_lora_policy(model_dir):
    policy = Policy(model_dir, PolicyConfig(peft_config=LORA))
    for name, p in policy.model.named_parameters():  # a trained adapter: B != 0 changes the merged weights
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return policy


def test_the_base_alone_leaves_the_adapter_out(tiny_model_dir):
    policy = trained_lora_policy(tiny_model_dir)
    base = inference_weights(policy, merge_adapter=False)
    original = inference_weights(Policy(tiny_model_dir))  # the model as loaded, no adapter
    assert set(base) == set(original)
    for name, tensor in original.items():
        torch.testing.assert_close(base[name], tensor, rtol=0, atol=0, msg=name)


def test_adapter_versions_are_new_folders_names_and_ids_and_only_the_newest_stays(tiny_model_dir, tmp_path):
    policy = trained_lora_policy(tiny_model_dir)
    versions = AdapterVersions(str(tmp_path / "weights"))
    first = versions.save(policy)
    with torch.no_grad():
        next(p for p in policy.trainable_parameters()).add_(1.0)  # an optimiser step
    second = versions.save(policy)
    assert (first.number, second.number) == (1, 2)  # vLLM caches by id: a reused id would serve version 1
    assert first.name != second.name and second.name.startswith(versions.root.name)  # unique across runs
    assert [p.name for p in versions.root.iterdir()] == ["v2"]  # version 1 removed
    files = sorted(p.name for p in Path(second.path).iterdir())
    assert files == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert second.num_bytes == sum(p.stat().st_size for p in Path(second.path).glob("adapter_*"))
    tensors = load_file(Path(second.path) / "adapter_model.safetensors")
    assert tensors and all("lora_" in name for name in tensors)  # the adapter only, never the base
    assert second.num_bytes < weight_bytes(inference_weights(policy)) / 10
    versions.close()
    assert not versions.root.exists()


def test_vllm_lora_rank_is_the_adapters_rounded_up_to_one_vllm_accepts(tiny_model_dir):
    assert adapter_rank(Policy(tiny_model_dir, PolicyConfig(peft_config=LORA))) == 4
    assert [max_lora_rank(r) for r in (1, 4, 8, 9, 320)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="LoRA rank 600 is above vLLM's largest max_lora_rank 512"):
        max_lora_rank(600)


def test_lora_sync_must_be_a_known_choice():
    check_lora_sync("VLLMColocate", "merged")
    with pytest.raises(ValueError, match=r"VLLMColocate lora_sync must be one of \['adapter', 'merged'\], got 'merge'"):
        check_lora_sync("VLLMColocate", "merge")


def test_the_policy_checked_against_itself_passes_and_against_a_stale_copy_fails(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    prompt = probe_prompt(policy)
    with torch.no_grad():
        ids = policy.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=4, min_new_tokens=4)
        logits = policy.model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    tokens = ids[0, len(prompt) :].tolist()
    logps = logits.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()
    assert policy_side(policy, prompt, tokens, logps, 1e-3).ok  # an engine with the policy's weights
    with torch.no_grad():  # one optimiser step's worth of change, which the engine did not get
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    assert not policy_side(policy, prompt, tokens, logps, 1e-3).ok


@pytest.mark.parametrize("gib", [0, 0.5, 1.5])
def test_the_cpu_kv_cache_is_a_whole_number_of_gib(monkeypatch, gib):
    # vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer: 0.5 failed at start-up, after the model had loaded
    from lightning_grpo.engines.vllm import colocate as vllm

    monkeypatch.setattr(vllm, "vllm_problems", lambda engine: [])  # as where vLLM is installed
    with pytest.raises(ValueError, match=rf"cpu_kv_cache_gib must be a whole number of GiB >= 1 .*got {gib}"):
        vllm.VLLMColocate(cpu_kv_cache_gib=gib)
    assert vllm.VLLMColocate(cpu_kv_cache_gib=2).cpu_kv_cache_gib == 2


def test_adapter_sync_of_a_sharded_policy_is_refused_before_any_step(monkeypatch, tiny_model_dir):
    # before, the first push raised, after a whole training step and a collective
    from types import SimpleNamespace

    from lightning.pytorch.strategies import ModelParallelStrategy

    from lightning_grpo.engines.vllm import colocate as vllm

    monkeypatch.setattr(vllm, "vllm_problems", lambda engine: [])  # as where vLLM is installed
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config=LORA))
    trainer = SimpleNamespace(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    with pytest.raises(ValueError, match=r"lora_sync='adapter' cannot serve a sharded \(FSDP\) policy.*'merged'"):
        vllm.VLLMColocate(lora_sync="adapter").setup(policy, trainer, seed=0)
    assert Policy.shards_under(trainer.strategy) and not Policy.shards_under(None)


class LoadingEngine:
    """A stand-in for a vLLM engine, in this process: its own copy of the model, into which pushed weights load by
    their Hugging Face names (an unknown name fails) and adapter versions through PEFT, as vLLM loads them; the
    probe decoded greedily from what it serves."""

    def __init__(self, model_dir: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.served, self.versions = self.model, []

    def push(self, weights):
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        assert not missing and set(unexpected) <= {"lm_head.weight"}, (missing, unexpected)  # the tied head

    def load_adapter(self, version):
        from peft import PeftModel

        self.served = PeftModel.from_pretrained(copy.deepcopy(self.model), version.path)
        self.versions.append(version.number)

    def probe(self, prompt):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.served.generate(ids, do_sample=False, max_new_tokens=PROBE_TOKENS, min_new_tokens=PROBE_TOKENS)
            logps = self.served(out).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)  # [K, V]
        tokens = out[0, len(prompt) :].tolist()
        return tokens, logps.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


class DroppingEngine(LoadingEngine):
    """Only its first push of each kind arrives; the later ones reach nothing (verl #7495's silent failure)."""

    def push(self, weights):
        if not hasattr(self, "pushed"):
            self.pushed = super().push(weights)

    def load_adapter(self, version):
        if not self.versions:
            super().load_adapter(version)


def optimiser_step(policy):
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora_merged"])
def test_the_whole_model_pushed_each_step_is_what_the_engine_serves(tiny_model_dir, lora):
    policy = trained_lora_policy(tiny_model_dir) if lora else Policy(tiny_model_dir)
    sync, engine = WeightSync("VLLMColocate", 1, None, "merged"), LoadingEngine(tiny_model_dir)
    assert not sync.serve_adapters(policy)  # merged: the whole model every push
    for step in (1, 2):
        optimiser_step(policy)
        sync(policy, engine, step)
        assert sync.metrics["vllm/sync_logp_error"] < 1e-4 and sync.pushes == step
    assert sync.metrics["vllm/push_mb"] == weight_bytes(inference_weights(policy)) / 2**20
    sync, dropping = WeightSync("VLLMColocate", 1, None, "merged"), DroppingEngine(tiny_model_dir)
    sync(policy, dropping, 3)
    optimiser_step(policy)
    with pytest.raises(WeightSyncError, match="VLLMColocate does not generate .* after the push of step 4"):
        sync(policy, dropping, 4)


def test_the_adapter_alone_each_step_the_base_once_and_a_lost_version_stops_the_run(tiny_model_dir, tmp_path):
    policy = trained_lora_policy(tiny_model_dir)
    sync, engine = WeightSync("VLLMServer", 1, None, "adapter", base_first=True), LoadingEngine(tiny_model_dir)
    assert sync.serve_adapters(policy, str(tmp_path)) and sync.adapters.parent == str(tmp_path)
    base_mb = weight_bytes(inference_weights(policy, merge_adapter=False)) / 2**20
    sizes = []
    for step in (1, 2):
        optimiser_step(policy)
        sync(policy, engine, step)
        sizes.append(sync.metrics["vllm/push_mb"])
        assert sync.metrics["vllm/sync_logp_error"] < 1e-4
    assert engine.versions == [1, 2]  # a new id each push: vLLM serves a known id's old weights
    assert sizes[0] > base_mb > 10 * sizes[1]  # the base went with the first push only (a server outlives runs)
    dropping = DroppingEngine(tiny_model_dir)
    sync = WeightSync("VLLMServer", 1, None, "adapter")
    sync.serve_adapters(policy, str(tmp_path))
    sync(policy, dropping, 1)
    optimiser_step(policy)
    with pytest.raises(WeightSyncError, match="VLLMServer does not generate .* after the push of step 2"):
        sync(policy, dropping, 2)


def test_the_check_runs_every_check_every_pushes_and_never_with_zero(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    engine = LoadingEngine(tiny_model_dir)
    every_second, never = WeightSync("E", 2, None, "merged"), WeightSync("E", 0, None, "merged")
    checked = []
    for step in (1, 2, 3, 4):
        every_second(policy, engine, step)
        never(policy, engine, step)
        checked.append("vllm/sync_logp_error" in every_second.metrics)
        assert "vllm/sync_logp_error" not in never.metrics
    assert checked == [False, True, False, True]
    with pytest.raises(ValueError, match=r"E sync_check_every must be >= 0 \(0: never\), got -1"):
        WeightSync("E", -1, None, "merged")


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "base"])
def test_modules_to_save_are_pushed_under_the_base_names(tiny_model_dir, merge):
    """A trained embedding (PEFT ``modules_to_save``) holds a trained and an original copy: vLLM gets the trained
    one as ``model.embed_tokens.weight`` (the original with the base alone), never the PEFT names it does not
    know (before: ``...modules_to_save.default.weight`` and ``...original_module.weight``)."""
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config={**LORA, "modules_to_save": ["embed_tokens"]}))
    trained = policy.model.base_model.model.model.embed_tokens.modules_to_save["default"].weight
    with torch.no_grad():
        trained.add_(1.0)  # an optimiser step on the trained copy
    weights = inference_weights(policy, merge_adapter=merge)
    original = inference_weights(Policy(tiny_model_dir))
    assert set(weights) == set(original)
    expected = trained if merge else original["model.embed_tokens.weight"]
    torch.testing.assert_close(weights["model.embed_tokens.weight"], expected.detach(), rtol=0, atol=0)


def test_adapter_sync_of_modules_trained_in_full_is_refused_before_any_step(tiny_model_dir):
    """A projector (or an embedding) in ``modules_to_save`` trains in full beside the adapter; vLLM loads no full
    module from an adapter but a classifier head, so adapter-only sync would leave vLLM its base copy (a vision-
    language LoRA run's projector, always): refused, naming ``'merged'``, which pushes them (the test above)."""
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config={**LORA, "modules_to_save": ["embed_tokens"]}))
    with pytest.raises(ValueError, match=r"modules_to_save: \['embed_tokens'\].*Set lora_sync='merged'"):
        WeightSync("VLLMServer", 0, None, "adapter").serve_adapters(policy)
    assert not WeightSync("VLLMServer", 0, None, "merged").serve_adapters(policy)


class DownEngine(LoadingEngine):
    """A server that no longer answers: every call fails as a refused connection does."""

    def push(self, weights):
        raise Unreachable("http://127.0.0.1:9: connection refused")

    load_adapter = probe = push


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora_adapter"])
def test_every_engine_gets_each_push_checked_one_that_does_not_answer_is_named_one_back_catches_up(
    tiny_model_dir, tmp_path, lora
):
    """VLLMServer's servers by name: each gets the push (its own bytes and seconds under servers/<name>/) and is
    checked; an unreachable one is skipped and named; one that comes back gets the current weights (the base and
    the current adapter version) and is checked; a server that dropped a push is named in the error."""
    policy = trained_lora_policy(tiny_model_dir) if lora else Policy(tiny_model_dir)
    sync = WeightSync("VLLMServer", 1, None, "adapter", base_first=True)
    sync.serve_adapters(policy, str(tmp_path))
    engines = {"0": LoadingEngine(tiny_model_dir), "1": DownEngine(tiny_model_dir)}
    for step in (1, 2):
        optimiser_step(policy)
        sync(policy, engines, step)
        assert list(sync.unreachable) == ["1"] and "servers/1/push_mb" not in sync.metrics
        assert sync.metrics["servers/0/push_mb"] == sync.metrics["vllm/push_mb"] > 0
        assert sync.metrics["servers/0/push_s"] > 0 and sync.metrics["vllm/sync_logp_error"] < 1e-4
    back = LoadingEngine(tiny_model_dir)  # restarted: the start-up weights, no adapter
    sync.catch_up(policy, {"1": back}, 2)
    assert sync.unreachable == {} and sync.metrics["vllm/sync_logp_error"] < 1e-4
    assert back.versions == ([sync.adapters.number] if lora else [])  # the version the others serve
    dropping = {"0": engines["0"], "1": DroppingEngine(tiny_model_dir)}  # its first push arrives, no later one
    sync.catch_up(policy, {"1": dropping["1"]}, 2)
    optimiser_step(policy)
    with pytest.raises(WeightSyncError, match=r"VLLMServer does not generate .* after the push of step 3: server 1,"):
        sync(policy, dropping, 3)
