"""The agent endpoint (``engines.OpenAIAgent``) with the real ``openai`` client over real HTTP, on the tiny model.

The tiny model has random weights: the agents here are scripted (a fixed number of turns, a tool reply each), so
the tests are about what is recorded and served, not about what the model says.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import warnings

import pytest
import torch
from helpers import ROOT, KeepRollouts, fit

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import HFGenerate, LeanDecode, OpenAIAgent, agent_reward
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy

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


def test_a_sampler_that_cannot_serve_is_refused_when_built():
    """A sampler without ``complete`` is refused (``VLLMServer`` serves the endpoint:
    tests/engines/vllm/test_servers_sticky.py)."""
    from lightning_grpo.engines import RolloutFunction

    with pytest.raises(ValueError, match="sampler must be an engine that serves the endpoint.*got RolloutFunction"):
        OpenAIAgent(two_turn_agent, sampler=RolloutFunction(lambda prompts, trainer: {}))


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


REFUSES_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
USER = [{"role": "user", "content": "a?"}]
CALLS_AS_STRINGS = [*USER, {"role": "assistant", "tool_calls": ["mul"]}]
MALFORMED = {  # what an agent may send -> the field its 400 must name
    "not_an_object": ([1, 2], None),
    "messages_a_string": ({"messages": "hello"}, "messages"),
    "messages_as_strings": ({"messages": ["hello"]}, "messages[0]"),
    "content_an_object": ({"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
    "calls_as_strings": ({"messages": CALLS_AS_STRINGS}, "messages[1].tool_calls[0]"),
    "tools_as_strings": ({"messages": USER, "tools": ["calc"]}, "tools[0]"),
    "max_tokens_a_string": ({"messages": USER, "max_tokens": "4"}, "max_tokens"),
    "template_raises": ({"messages": [{"role": "system", "content": "be brief"}, *USER]}, "messages"),
}


def test_a_malformed_request_gets_a_400_naming_its_field_and_the_other_agents_play_on(policy):
    """Issue 43 item 6 (and 13: a body that is not an object): each malformed request is answered 400 naming its
    field, whatever the template does; the same agents' next requests and the other agents are served."""
    import httpx

    answers: dict[str, list] = {}

    def agent(base_url: str, row: dict) -> float:
        if row["kind"] == "good":
            return two_turn_agent(client(base_url), row)
        body, _ = MALFORMED[row["kind"]]
        bad = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)
        good = httpx.post(f"{base_url}/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=30)
        answers[row["kind"]] = [bad.status_code, bad.json()["error"], good.status_code]
        return 0.0

    kinds = [*MALFORMED, "good", "good"]
    engine = OpenAIAgent(agent, "base_url", timeout=60, on_error="raise")
    template = policy.tokenizer.chat_template
    policy.tokenizer.chat_template = REFUSES_SYSTEM + template
    try:
        rollout = engine.generate(policy, prompts(len(kinds)), 1, SAMPLING, greedy=False, columns={"kind": kinds})
    finally:
        policy.tokenizer.chat_template = template
        start = time.monotonic()
        engine.teardown()
        assert time.monotonic() - start < 3  # stop() returns promptly
    for kind, (_, field) in MALFORMED.items():
        status, error, then = answers[kind]
        assert (status, then) == (400, 200), (kind, error)
        assert error["param"] == field and error["message"].startswith(field or "the request body must be"), error
    assert "System role not supported" in answers["template_raises"][1]["message"]
    assert rollout.metrics["agents/errors"] == 0  # on_error="raise": every agent returned
    good = [i for i, kind in enumerate(kinds) if kind == "good"]
    assert (rollout.tool_mask[good].sum(1) >= 2).all()  # the well-formed agents played both their turns


def test_stop_answers_the_requests_still_waiting_at_once():
    """Issue 43 item 6: ``Endpoint.stop()`` with requests queued that nothing will generate (a rollout that failed)
    answers them 503 and returns, instead of waiting out its timeout."""
    import httpx

    from lightning_grpo.engines.agents.endpoint import Endpoint

    endpoint, queued, replies = Endpoint(), [], []
    endpoint.start(queued.append)
    url = f"http://127.0.0.1:{endpoint.port}/sessions/s/v1/chat/completions"
    asking = threading.Thread(target=lambda: replies.append(httpx.post(url, json={"messages": USER}, timeout=30)))
    asking.start()
    deadline = time.monotonic() + 10
    while not queued and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    endpoint.stop()
    assert time.monotonic() - start < 3
    asking.join(10)
    assert replies[0].status_code == 503 and "stopping" in replies[0].json()["error"]["message"]


def test_a_request_accepted_as_the_rollout_closes_never_reaches_the_next_rollout(policy):
    """Issue 43 item 7. The window between accepting a request and queueing it is widened without changing any
    code: a trace function holds the endpoint's thread at the queue's ``put`` until the rollout has closed (or
    1 s has passed: the fix holds the lock that closing needs). The request must get an answer, and the next
    rollout must not meet it."""
    import httpx

    arm, held, late = threading.Event(), threading.Event(), []
    engine = OpenAIAgent(lambda base_url, row: agent(base_url, row), "base_url", timeout=60)

    def pause(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "put" and frame.f_back.f_code.co_name == "_accept":
            if arm.is_set():
                arm.clear()
                held.set()
                deadline = time.monotonic() + 1.0
                while engine.live and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.1)

    def ask_late(base_url: str) -> None:
        try:
            reply = httpx.post(f"{base_url}/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=15)
            late.append(reply.status_code)
        except httpx.TimeoutException:
            late.append("no answer")

    def agent(base_url: str, row: dict) -> float:
        httpx.post(f"{base_url}/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=15)
        if row["late"]:
            arm.set()
            threading.Thread(target=ask_late, args=(base_url,), daemon=True).start()
            held.wait(10)  # the late request is past the checks: the agent returns, the rollout closes
        return 0.0

    threading.settrace(pause)  # the threads started from here on: the endpoint's among them
    try:
        engine.generate(policy, prompts(1), 1, SAMPLING, greedy=False, columns={"late": [True]})
    finally:
        threading.settrace(None)
    assert held.is_set(), "the endpoint no longer queues requests in _accept: widen the window elsewhere"
    engine.generate(policy, prompts(1), 1, SAMPLING, greedy=False, columns={"late": [False]})  # was: KeyError
    deadline = time.monotonic() + 15
    while not late and time.monotonic() < deadline:
        time.sleep(0.05)
    assert late and late[0] in (200, 404, 410), late
    engine.teardown()


def long_tool_agent(client: openai.OpenAI, row: dict) -> list:
    """Eight turns, each followed by a 60-token tool reply: far more than the tiny model's 256 positions."""
    messages, finishes = list(row["prompt"]), []
    for _ in range(8):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        finishes.append((reply.choices[0].finish_reason, reply.usage.completion_tokens))
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "x" * 60}]
    SERVED[str(client.base_url).rstrip("/")] = finishes
    return messages[len(row["prompt"]) :]


@pytest.mark.parametrize(("max_prompt_length", "limit"), [(512, 256), (20, 32)])  # positions; 20 + 12 of the run's
def test_an_agent_context_ends_at_the_model_s_positions_and_the_run_s_lengths(policy, max_prompt_length, limit):
    """Issue 43 item 9: the messages an agent adds between turns are bounded: the episode ends when they would
    leave no room for a model token (as ToolCalling ends its episode), and ``agents/context_full`` says so."""
    sampling = SamplingConfig(max_completion_length=12, max_prompt_length=max_prompt_length)
    engine = OpenAIAgent(long_tool_agent, timeout=60, on_error="raise")
    rollout = engine.generate(policy, prompts(2), 1, sampling, greedy=False)
    engine.teardown()
    lengths = rollout.prompt_mask.sum(1) + rollout.completion_mask.sum(1)
    assert lengths.max() <= limit, lengths  # was 8 x (60 + ~8) tokens and more, trained on
    assert rollout.metrics["agents/context_full"] == 1.0 and rollout.metrics["episodes/truncated_by_tokens"] == 1.0
    table = (ROOT / "references" / "metrics.md").read_text()
    assert all(f"| `train/{name}` |" in table for name in rollout.metrics if name.startswith("agents/"))
    for i in range(len(rollout)):
        finishes = served_of(rollout, engine, i)
        assert finishes[-1] == ("length", 0)  # once ended, every reply is empty, cut by length
        assert sum(rollout.tool_mask[i].tolist()) == sum(written for _, written in finishes)  # all served, trained


def test_a_busy_port_is_reported_at_once_with_its_cause(policy):
    """Issue 43 item 12: a port that cannot be bound says so at once, naming the setting and the cause."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        engine = OpenAIAgent(two_turn_agent, port=port)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"OpenAIAgent\(port={port}\): .* 127.0.0.1:{port}: .*in use") as e:
            engine.setup(policy, None, 0)
        assert time.monotonic() - start < 5 and isinstance(e.value.__cause__, OSError)
    engine.setup(policy, None, 0)  # freed: it listens there
    assert engine.endpoint.port == port
    engine.teardown()
