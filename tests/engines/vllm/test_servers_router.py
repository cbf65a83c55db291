"""A router or a server that does not answer, over real HTTP (issue 59 item 2): a dead ``vllm-router`` is said once,
counted, and asked again only now and then while the requests go straight to the servers; a call that fails says
whether the connection was refused at once or nothing came within the timeout, and after how long; an out-of-service
server that hangs costs a sync at most ``OUT_HEALTH_SECONDS``, then nothing for ``OUT_QUIET_SECONDS``.

The servers and the router are little HTTP servers in threads of this process that answer ``/health`` and
``/v1/completions`` (one token per completion, what ``ServerPool`` parses), stopped and started again on their port;
the hung server is a socket that listens and never accepts, as a process stopped with SIGSTOP would; the refused
one is a port nobody listens on. ``ServerPool`` and ``ServerControl`` run as in a run, on those sockets."""

import json
import socket
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import torch
from helpers import free_port

from lightning_grpo.engines.vllm import control, pool
from lightning_grpo.engines.vllm.control import ServerControl, WeightsFile, call
from lightning_grpo.engines.vllm.pool import ServerPool
from lightning_grpo.engines.vllm.sync import Unreachable


class Answering(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.reply({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":  # vLLM without VLLM_SERVER_DEV_MODE=1: no /collective_rpc
            return self.reply({"detail": "Not Found"}, 404)
        self.server.completions += 1
        n = len(body["prompt"]) * body.get("n", 1)
        self.reply({"choices": [{"index": i, "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}}
                                for i in range(n)]})  # fmt: skip

    def reply(self, answer: dict, status: int = 200) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class Stand:
    """An answering HTTP server on a port of its own, in a thread; ``stop`` closes it (connections refused),
    ``start`` opens it again on the same port."""

    def __init__(self) -> None:
        self.port, self.http = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "Stand":
        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Answering)
        self.http.completions = 0
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def hung_url():
    """A server that took the connection and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def servers():
    stands = [Stand().start() for _ in range(2)]
    yield stands
    for stand in stands:
        stand.stop()


OPTIONS = {"n": 2, "temperature": 1.0, "max_tokens": 1}
PROMPTS = [[3, 4], [5, 6], [7, 8], [9]]  # 2 chunks of 2 prompts (2 live servers)


def test_a_call_says_whether_it_was_refused_at_once_or_timed_out_and_after_how_long(hung_url):
    """Said "did not answer within 600 s" for a connection refused in a millisecond."""
    refused = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(Unreachable, match=r"/health refused the connection \(after 0\.\d+ s\)") as err:
        call(requests.Session(), "GET", f"{refused}/health", 600)
    assert time.monotonic() - started < 1 and "600" not in str(err.value)
    with pytest.raises(Unreachable, match=r"did not answer within 0.5 s \(timed out after 0\.5\d* s\)"):
        call(requests.Session(), "GET", f"{hung_url}/health", 0.5)


def test_a_dead_router_is_warned_once_counted_and_asked_again_only_now_and_then(servers, monkeypatch):
    """Each chunk's first try went to the dead router at every step (``retried_groups`` 8 per rank-step), with no
    warning. Now: one warning naming it, ``servers/router/down`` 1 and its failed tries counted, the next steps
    straight to the servers (nothing retried), its ``/health`` asked every ``ROUTER_RETRY_SECONDS``, and the router
    back in the path once it answers."""
    monkeypatch.setattr(pool, "ROUTER_RETRY_SECONDS", 1.0)  # 60 s in a run
    router = Stand()  # not started: its port refuses
    ranks = ServerPool([s.url for s in servers], router.url, rank=0, max_tries=3, request_timeout=60)
    with pytest.warns(
        UserWarning, match=rf"the router {router.url} \(router_url\) does not answer .*refused.*straight"
    ):
        completions, _ = ranks.complete("m", PROMPTS, OPTIONS)
    assert completions == [[7]] * 8  # served by the servers
    first = ranks.take_metrics()
    tried = first["servers/router/requests"]  # 1 or 2: a chunk that starts after the first failed skips it
    assert tried in (1, 2) and first["servers/router/failed"] == tried and first["servers/router/down"] == 1
    assert first["servers/retried_groups"] == 2 * tried  # each chunk 2 prompts
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        for _ in range(3):
            ranks.complete("m", PROMPTS, OPTIONS)
            later = ranks.take_metrics()
            assert later["servers/router/requests"] == 0 and later["servers/retried_groups"] == 0
            assert later["servers/router/down"] == 1 and later["servers/router/failed"] == 0
            assert later["servers/0/requests"] == later["servers/1/requests"] == 1
        turns = ranks.complete_sessions("m", [[3], [4]], [{"n": 1, "max_tokens": 1}] * 2, ["a", "b"])
        assert turns[0] == [[7], [7]] and ranks.take_metrics()["servers/moved_sessions"] == 0  # pinned, not moved
    time.sleep(1.1)
    ranks.complete("m", PROMPTS, OPTIONS)  # its /health refused: still down, no request tried on it
    assert ranks.take_metrics()["servers/router/requests"] == 0
    router.start()
    try:
        time.sleep(1.1)
        ranks.complete("m", PROMPTS, OPTIONS)
        back = ranks.take_metrics()
        assert back["servers/router/requests"] == 2 and back["servers/router/down"] == 0
        assert router.http.completions == 2 and back["servers/retried_groups"] == 0
    finally:
        router.stop()


def test_a_hung_out_of_service_server_costs_a_sync_one_second_then_nothing_for_a_while(hung_url, servers):
    """A hung server out of service cost every step's sync a 5 s ``/health`` (0.15 -> 5.1 s a step). Now at most
    ``OUT_HEALTH_SECONDS``, then it is not asked for ``OUT_QUIET_SECONDS``; a refused one is asked at every sync (it
    costs nothing) and one that answers is back."""
    hung = ServerControl(hung_url, "1", timeout=600)
    started = time.monotonic()
    assert not hung.answers_again()
    assert control.OUT_HEALTH_SECONDS <= time.monotonic() - started < control.OUT_HEALTH_SECONDS + 0.5
    started = time.monotonic()
    assert not hung.answers_again() and time.monotonic() - started < 0.05  # quiet: not asked
    refused = ServerControl(f"http://127.0.0.1:{free_port()}", "2", timeout=600)
    assert not refused.answers_again() and refused.quiet_until == 0.0
    assert ServerControl(servers[0].url, "0", timeout=600).answers_again()


def test_a_server_without_dev_mode_is_named_with_the_setting_that_fixes_it(servers, tmp_path):
    """Issue 59 item 2: the first push to a server started without VLLM_SERVER_DEV_MODE=1 got `/collective_rpc`
    404, which named no fix."""
    server = ServerControl(servers[0].url, "0", timeout=60)
    server.weights_file = WeightsFile(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"answers 404 to /collective_rpc.*Start it with VLLM_SERVER_DEV_MODE=1"):
        server.push({"w": torch.zeros(2)})
