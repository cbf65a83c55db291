"""The agent endpoint (``engines.OpenAIAgent``) with the real ``openai`` client over real HTTP, on the tiny model.

The tiny model has random weights: the agents here are scripted (a fixed number of turns, a tool reply each), so
the tests are about what is recorded and served, not about what the model says.
"""

from __future__ import annotations

import random
import threading
import time
import warnings

import pytest
import torch

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import HFGenerate, LeanDecode, OpenAIAgent, agent_reward
from lightning_grpo.model.policy import Policy
from lightning_grpo.rollout import SamplingConfig
from tests.helpers import KeepRollouts, fit

openai = pytest.importorskip("openai")

SAMPLING = SamplingConfig(max_completion_length=12)
SERVED: dict[str, list[list[int]]] = {}  # base URL -> the token ids of each reply, as the agent got them


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-agent")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def policy(tool_model_dir):
    return Policy(tool_model_dir)


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def two_turn_agent(client: openai.OpenAI, row: dict) -> float:
    """Asks, sends a tool reply, asks again (after a random pause: the episodes interleave); 1.0 if the last
    reply is non-empty. Records what it was served."""
    messages = list(row["prompt"])
    for turn in range(2):
        time.sleep(random.random() * 0.05)
        reply = client.chat.completions.create(model="policy", messages=messages)
        SERVED.setdefault(str(client.base_url).rstrip("/"), []).append(reply.choices[0].model_extra["token_ids"])
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": f"r{turn}"}]
    return float(bool(reply.choices[0].message.content))


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"{'ab'[i % 2] * (i + 1)}?"}] for i in range(n)]


def served_of(rollout, engine: OpenAIAgent, i: int) -> list[list[int]]:
    return SERVED[engine.endpoint.base_url(rollout.columns["episode_id"][i])]


@pytest.mark.parametrize("sampler", [HFGenerate, LeanDecode])
def test_concurrent_episodes_never_mix_tokens(policy, sampler):
    engine = OpenAIAgent(two_turn_agent, timeout=60, sampler=sampler())
    rollout = engine.generate(policy, prompts(3), 4, SAMPLING, greedy=False)
    tokenizer = policy.tokenizer
    for i in range(len(rollout)):
        prompt = tokenizer.decode(rollout.prompt_ids[i][rollout.prompt_mask[i].bool()])
        assert rollout.prompts[i][0]["content"] in prompt  # its own prompt, in its own row
        trained = rollout.completion_ids[i][rollout.tool_mask[i].bool()].tolist()
        assert trained == sum(served_of(rollout, engine, i), [])  # its own tokens, all of them, in order
        shown = tokenizer.decode(rollout.completion_ids[i][(rollout.completion_mask - rollout.tool_mask)[i].bool()])
        assert "r0" in shown and "r1" not in shown  # the tool reply between its turns, masked out of the loss
    assert rollout.metrics["agents/requests"] == 2 and rollout.metrics["agents/restarts"] == 0
    assert (rollout.sampling_logps is None) == (sampler is LeanDecode)  # LeanDecode is the policy itself


def jittery_agent(client: openai.OpenAI, row: dict) -> float:
    """One request, after a random pause shorter than the engine's batch_wait: the requests of a batch arrive in a
    different order on every run."""
    time.sleep(random.random() * 0.02)
    client.chat.completions.create(model="policy", messages=row["prompt"])
    return 0.0


def test_the_same_seed_samples_the_same_episodes_whatever_order_the_agents_ask_in(policy):
    engine = OpenAIAgent(jittery_agent, timeout=60, batch_wait=0.5)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(engine.generate(policy, prompts(2), 4, SAMPLING, greedy=False).completion_ids)
    assert torch.equal(runs[0], runs[1])  # each episode sampled in its row's place of the batch


def test_lean_decode_serves_the_turns_hf_generate_serves(policy):
    """Greedy, the two samplers' ``complete`` give the same turns: contexts of different lengths (left-padded
    together), each cut at its own budget or EOS."""
    contexts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    budgets = [7, 3, 12]
    lean = LeanDecode().complete(policy, contexts, budgets, SAMPLING, greedy=True)
    hf = HFGenerate().complete(policy, contexts, budgets, SAMPLING, greedy=True)
    assert [ids for ids, _ in lean] == [ids for ids, _ in hf]
    assert [len(ids) for ids, _ in lean] == [7, 3, 12] and all(logps is None for _, logps in lean)
    recorded = LeanDecode(sampler_logps=True).complete(policy, contexts, budgets, SAMPLING, greedy=True)
    for (ids, logps), (hf_ids, hf_logps) in zip(recorded, hf):  # with sampler_logps: generate's scores' log-probs
        assert ids == hf_ids and logps == pytest.approx(hf_logps, abs=1e-4)


def test_the_sampler_log_probs_are_the_policy_s(policy):
    engine = OpenAIAgent(two_turn_agent, timeout=60)
    rollout = engine.generate(policy, prompts(2), 2, SAMPLING, greedy=False)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask).logits[:, rollout.prompt_ids.shape[1] - 1 : -1]
    logps = logits.float().log_softmax(-1).gather(2, rollout.completion_ids.unsqueeze(2)).squeeze(2)  # [N, T]
    model = rollout.tool_mask.bool()
    assert torch.allclose(rollout.sampling_logps[model], logps[model], atol=1e-4)


def test_a_hanging_agent_times_out_cleanly(policy):
    release = threading.Event()
    late: list[Exception] = []

    def agent(client: openai.OpenAI, row: dict) -> float:
        if "aaa" in row["prompt"][0]["content"]:
            release.wait()  # hangs until the test lets it go, long after the timeout
            try:
                client.chat.completions.create(model="policy", messages=row["prompt"])
            except openai.APIStatusError as e:
                late.append(e)
            return 1.0
        return two_turn_agent(client, row)

    engine = OpenAIAgent(agent, timeout=6, on_error="skip")  # the other four agents take well under a second
    start = time.monotonic()
    rollout = engine.generate(policy, prompts(3), 2, SAMPLING, greedy=False)
    assert time.monotonic() - start < 30  # the timeout, and not the hanging agent, ends the rollout
    hung = [i for i, p in enumerate(rollout.prompts) if "aaa" in p[0]["content"]]
    assert rollout.metrics["agents/timeouts"] == pytest.approx(2 / 6)
    assert [rollout.columns["agent_reward"][i] for i in hung] == [None, None]  # skip: not applicable, not trained
    assert rollout.tool_mask[hung].sum() == 0
    release.set()
    deadline = time.monotonic() + 10
    while len(late) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e.status_code for e in late] == [404, 404]  # the rollout is over: its episodes are not served


def test_a_failing_agent_is_handled_by_on_error(policy):
    def agent(base_url: str, row: dict) -> float:
        raise KeyError("the agent's own bug")

    engine = OpenAIAgent(agent, "base_url", timeout=10, on_error="zero")
    with pytest.warns(UserWarning, match=r"agent 'agent' failed \(KeyError: \"the agent's own bug\"\), first on row"):
        zero = engine.generate(policy, prompts(1), 2, SAMPLING, False)
    assert zero.columns["agent_reward"] == [0.0, 0.0] and zero.metrics["agents/errors"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same error again: said once
        engine.generate(policy, prompts(1), 2, SAMPLING, False)
    with pytest.raises(RuntimeError, match="the agent's own bug"):
        OpenAIAgent(agent, "base_url", timeout=10, on_error="raise").generate(policy, prompts(1), 2, SAMPLING, False)


def test_the_endpoint_refuses_requests_outside_a_rollout(policy):
    engine = OpenAIAgent(two_turn_agent, timeout=60)
    engine.setup(policy, None, 0)
    with pytest.raises(openai.NotFoundError, match="no episode 'made-up' is being played"):
        client(engine.endpoint.base_url("made-up")).chat.completions.create(model="policy", messages=prompts(1)[0])
    plain = openai.OpenAI(base_url=f"http://127.0.0.1:{engine.endpoint.port}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="name the episode"):
        plain.chat.completions.create(model="policy", messages=prompts(1)[0])
    rollout = engine.generate(policy, prompts(1), 2, SAMPLING, greedy=False)
    with pytest.raises(openai.NotFoundError):  # an episode that has ended
        client(engine.endpoint.base_url(rollout.columns["episode_id"][0])).completions.create(model="p", prompt="x")
    assert plain.models.list().data[0].id == "policy"


def test_the_completions_endpoint_continues_an_episode(policy):
    def agent(base_url: str, row: dict) -> None:
        text = "1+1="
        for _ in range(2):
            reply = client(base_url).completions.create(model="policy", prompt=text, max_tokens=4)
            SERVED.setdefault(base_url, []).append(reply.choices[0].model_extra["token_ids"])
            text += reply.choices[0].text + " ok "
        return None

    engine = OpenAIAgent(agent, "base_url", timeout=60)
    rollout = engine.generate(policy, ["1+1="], 2, SAMPLING, greedy=False)
    for i in range(2):
        served = served_of(rollout, engine, i)
        assert all(len(ids) <= 4 for ids in served)  # max_tokens is honoured
        assert rollout.completion_ids[i][rollout.tool_mask[i].bool()].tolist() == sum(served, [])
    assert rollout.metrics["agents/restarts"] == 0


@pytest.mark.parametrize("sampler", [HFGenerate, LeanDecode])
def test_the_trained_tokens_are_the_served_tokens(tool_model_dir, tmp_path, sampler):
    from lightning_grpo import GRPOModule, PromptDataModule

    data_path = tmp_path / "train.jsonl"
    data_path.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{c}?"}}]}}\n' for c in "abcd"))
    module = GRPOModule(
        tool_model_dir,
        reward_funcs=[agent_reward],
        num_generations=4,
        sampling={"max_completion_length": 12},
        rollout_engine=OpenAIAgent(two_turn_agent, timeout=60, sampler=sampler()),
    )
    keep = KeepRollouts()
    fit(module, PromptDataModule(str(data_path), batch_size=2), tmp_path, max_steps=2, callbacks=[keep])
    assert len(keep.rollouts) == 2
    for rollout in keep.rollouts:
        for i in range(len(rollout)):
            trained = rollout.completion_ids[i][rollout.model_mask[i].bool()].tolist()
            assert trained == sum(served_of(rollout, module.engine, i), [])


@pytest.mark.parametrize("name", ["RolloutFunction", "VLLMServer"])
def test_a_sampler_that_cannot_serve_is_refused_when_built(name):
    from lightning_grpo.engines import RolloutFunction, VLLMServer

    sampler = RolloutFunction(lambda prompts, trainer: {}) if name == "RolloutFunction" else VLLMServer()
    with pytest.raises(ValueError, match=f"sampler must be an engine that serves the endpoint.*got {name}"):
        OpenAIAgent(two_turn_agent, sampler=sampler)


def test_a_run_whose_agents_all_fail_before_asking_trains_on(tool_model_dir, tmp_path):
    """No episode wrote a token (the agent fails at once): the step has nothing to train, and says why."""
    from lightning_grpo import GRPOModule, PromptDataModule

    def broken(client, row) -> float:
        raise KeyError("extra_info")

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{c}?"}}]}}\n' for c in "abcd"))
    engine = OpenAIAgent(broken, timeout=10)
    module = GRPOModule(tool_model_dir, reward_funcs=[agent_reward], num_generations=2, rollout_engine=engine)
    with pytest.warns(UserWarning, match=r"agent 'broken' failed \(KeyError: 'extra_info'\)"):
        trainer = fit(module, PromptDataModule(str(data), batch_size=2, val_size=0), tmp_path, max_steps=2)
    assert trainer.global_step == 2
