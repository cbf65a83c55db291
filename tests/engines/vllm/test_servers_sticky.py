"""Agent episodes stick to one vLLM server (issue 44): ``OpenAIAgent`` whose sampler is ``VLLMServer`` over two
servers sends every turn of an episode to the server that served its first (its prefix is cached there), the
episodes spread over the servers, and an episode whose server dies goes on on the other (counted). The policy, the
agent endpoint and the HTTP traffic are real; the servers are ``vllm_fake_server.py`` processes (Hugging Face
``generate`` behind vLLM's endpoints), which record each request's ``X-Session-ID`` header: the episode, as
vllm-router's ``consistent_hash`` policy reads it."""

import itertools
import subprocess
import sys
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import requests
from helpers import TESTS, free_port

from lightning_grpo.demo.tiny import TOOL_CHAT_TEMPLATE
from lightning_grpo.engines import OpenAIAgent, VLLMServer
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.policy import Policy

FAKE_SERVER = TESTS / "engines" / "vllm" / "vllm_fake_server.py"
TURNS = 3
OUTAGE: dict = {}  # "server": the stand-in the first agent to get its first reply kills; "served": what it had served
OUTAGE_LOCK = threading.Lock()
STARTED = itertools.count()


class StandIn:
    """A ``vllm_fake_server.py`` process on a free port."""

    def __init__(self, model_dir: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), model_dir, str(self.port)],
                                     stdout=subprocess.DEVNULL)  # fmt: skip

    def wait(self) -> "StandIn":
        for _ in range(1200):
            try:
                requests.get(f"{self.url}/health", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"the stand-in server on {self.port} did not start")

    def sessions(self) -> list[str]:
        """The episode of each ``/v1/completions`` request it served (the sync's probes name none)."""
        return [s for s in requests.get(f"{self.url}/stats", timeout=10).json()["sessions"] if s is not None]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-agent")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(path)
    return str(path)


@pytest.fixture
def two_servers(tool_model_dir):
    servers = [StandIn(tool_model_dir) for _ in range(2)]
    yield [server.wait() for server in servers]
    for server in servers:
        server.kill()


def agent(base_url: str, row: dict) -> float:
    """1, 2 or 3 requests (the k-th agent to start: 1 + k % 3, so that later batches hold fewer episodes, in other
    places) of 4 tokens at most, a tool reply after each; the first agent to get a reply ends ``OUTAGE["server"]``
    when one is set (after every episode's first turn was served: the endpoint answers a batch at once)."""
    messages = list(row["prompt"])
    turns = 1 + next(STARTED) % 3 if not OUTAGE else TURNS
    for turn in range(turns):
        body = {"model": "policy", "messages": messages, "max_tokens": 4}
        reply = requests.post(f"{base_url}/chat/completions", json=body, timeout=120).json()
        messages += [reply["choices"][0]["message"], {"role": "tool", "content": f"r{turn}"}]
        with OUTAGE_LOCK:
            server = OUTAGE.pop("server", None)
        if server is not None:
            OUTAGE["served"] = server.sessions()
            server.kill()
    return 1.0


def play(engine: OpenAIAgent, policy: Policy):
    prompts = [[{"role": "user", "content": "ab?"}], [{"role": "user", "content": "ba?"}]]
    return engine.generate(policy, prompts, 4, SamplingConfig(max_completion_length=64, temperature=1.0), False)


def test_an_episode_s_turns_stay_on_one_server_and_move_once_when_it_dies(two_servers, tool_model_dir):
    policy = Policy(tool_model_dir)
    sampler = VLLMServer(base_url=[s.url for s in two_servers], connection_timeout=60, request_timeout=60)
    # batch_wait 10 s: each batch waits for every running agent, so the second turns come after the outage
    engine = OpenAIAgent(agent, agent_argument="base_url", timeout=120, sampler=sampler, batch_wait=10)
    engine.setup(policy, SimpleNamespace(global_rank=0, local_rank=0, world_size=1, global_step=0), seed=0)
    try:
        rollout = play(engine, policy)
        on = [Counter(server.sessions()) for server in two_servers]
        episodes = set(rollout.columns["episode_id"])
        # every turn of an episode on one server (15 turns in all), 4 of the 8 episodes on each
        assert set(on[0]) | set(on[1]) == episodes and not set(on[0]) & set(on[1])
        assert [len(c) for c in on] == [4, 4] and sorted((on[0] + on[1]).values()) == [1, 1, 1, 2, 2, 2, 3, 3]
        assert rollout.metrics["servers/moved_sessions"] == 0 and rollout.metrics["agents/requests"] == 15 / 8

        OUTAGE["server"] = two_servers[1]
        rollout = play(engine, policy)
        before = Counter(s for s in OUTAGE["served"] if s not in on[1])  # before it died: 4 first turns
        after = Counter(s for s in two_servers[0].sessions() if s not in on[0])
        assert sorted(before.values()) == [1] * 4 and set(before) <= set(rollout.columns["episode_id"])
        # its 4 episodes went on on server 0 (turns 2 and 3 there), the other 4 never left server 0
        assert {s: n for s, n in after.items() if s in before} == dict.fromkeys(before, TURNS - 1)
        assert sorted(n for s, n in after.items() if s not in before) == [TURNS] * 4
        assert rollout.metrics["servers/moved_sessions"] == 4 and rollout.metrics["agents/errors"] == 0
    finally:
        engine.teardown()
