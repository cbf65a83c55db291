"""Token-id prompts (and chat requests with images) -> completions from several ``vllm serve`` processes: the data
plane (``ServerPool``), with its failover, its sticky agent episodes and its check for restarted servers. Knows
which servers answer; nothing about the policy or training. One server's own calls are ``control.py``.

Two planes, as SkyRL, prime-rl and slime split them. The data plane carries generation: a rank's requests go to
a router in front of the servers when there is one (``vllm-router``), else each rank splits its own call over the
live servers itself, chunk j of rank r to live server (r + j) mod L, so that ranks start on different servers and
nothing passes through rank 0. The control plane is the list of every server, each called directly (a router
forwards generation, not weight reloads): ``ServerControl`` is one server's ``Transport`` for ``WeightSync``.

A request that fails (refused, timed out, a 5xx) is sent again to the next live server, at most ``max_tries``
tries; a server that failed is taken out of the data plane until ``VLLMServer``'s sync finds it answering again
and has given it the current weights. No completion is ever made up for a request that failed: when no try is
left the call raises ``NoServerLeft``, and the run stops there instead of scoring an empty completion.

A router that does not answer (refused, timed out: not a 5xx, which is a server's failure passed on) is a router
down: one warning names it, the rank's requests go straight to the servers (``servers/router/down`` 1, and
``servers/router/failed`` counts its tries that got no answer) and the router gets a request's first try again only
once it answers ``/health``, asked for at most ``OUT_HEALTH_SECONDS`` every ``ROUTER_RETRY_SECONDS``: a dead router
costs one short question a minute, not a failed try of every chunk of every step.

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

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.engines.vllm.control import (
    OUT_HEALTH_SECONDS,
    NoAnswer,
    NoServerLeft,
    call,
    completion_body,
    health,
    parse_chat,
    parse_choices,
    process_start,
)
from lightning_grpo.engines.vllm.sync import Unreachable

SESSION_HEADER = "X-Session-ID"  # vllm-router's consistent_hash policy routes by it first (then X-User-ID ...)
OFF_ROUTER = -1  # an episode the router's server failed: pinned by the pool at its next try
SESSION_THREADS = 64  # turn requests of one call in flight at once (the server batches them)
RESTART_CHECK_SECONDS = 5.0  # within a step (an agent's turns), each rank reads the servers' processes this often
ROUTER_RETRY_SECONDS = 60.0  # a router that did not answer gets a request's first try again after this long


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
        self.router_back_at = 0.0  # time.monotonic() before which the router, found down, gets no try
        self.router_failed = 0  # tries through the router that got no answer, this step

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
        return self._send(j, "/v1/completions", body, lambda answer: parse_choices(answer, expected), len(prompts))

    def complete_chats(
        self, bodies: list[dict[str, Any]]
    ) -> list[tuple[list[list[int]], list[list[float]], list[int]]]:
        """Each chat request's (one prompt with its images: ``control.chat_body``) ``n`` completions, their log-probs
        and the prompt ids the server ran; every request its own, sent at once, prompt j starting on live server
        (rank + j) mod L as a chunk would."""
        self.check_restarts()
        width = max(1, min(SESSION_THREADS, len(bodies)))

        def send(j: int):
            n = bodies[j].get("n", 1)
            return self._send(j, "/v1/chat/completions", bodies[j], lambda answer: parse_chat(answer, n), 1)

        with ThreadPoolExecutor(max_workers=width) as threads:
            return list(threads.map(send, range(len(bodies))))

    def _send(self, j: int, path: str, body: dict[str, Any], parse: Any, groups: int):
        """One request (chunk or prompt ``j``, of ``groups`` prompts) to ``path``, tried on the next live server
        when it fails, at most ``max_tries`` tries; its answer through ``parse``."""
        for attempt in range(self.max_tries):
            target = self._target(j, attempt)
            if target is None:
                break
            url = self.router if target == "router" else self.urls[int(target)]
            self._count(target)
            try:
                return parse(call(self.session, "POST", f"{url}{path}", self.request_timeout, body))
            except Unreachable as err:
                self._failed(target, groups, f"{url}: {err}", err)
        raise NoServerLeft(
            f"VLLMServer: {groups} prompts of rank {self.rank} got no completion after {self.max_tries} tries "
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
                answer = call(self.session, "POST", f"{url}/v1/completions", self.request_timeout, body, headers)
                return parse_choices(answer, 1)
            except Unreachable as err:
                self._failed(target, 0, f"{url}: {err}", err)
                if target == "router" and not isinstance(err, NoAnswer):  # its server failed: pinned from now on
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
            if server is None and self._routed():
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
        with self.lock:
            if attempt == 0 and self._routed():
                return "router"
            live = sorted(self.live)
        return str(live[(self.rank + j + attempt) % len(live)]) if live else None

    def _routed(self) -> bool:
        """Whether a first try goes to the router: there is one, no restarted server is behind it, and it is not
        down. A router down is asked for its ``/health`` (at most ``OUT_HEALTH_SECONDS``) once
        ``ROUTER_RETRY_SECONDS`` have passed, and routes again when it answers. Under ``self.lock``."""
        if self.router is None or self.direct:
            return False
        if self.router_back_at and time.monotonic() >= self.router_back_at:
            up = health(self.session, self.router, OUT_HEALTH_SECONDS)
            self.router_back_at = 0.0 if up else time.monotonic() + ROUTER_RETRY_SECONDS
        return not self.router_back_at

    def _router_down(self, err: NoAnswer) -> None:
        """The router got no answer: skipped for ``ROUTER_RETRY_SECONDS``, said once when it goes down. Under
        ``self.lock``."""
        self.router_failed += 1
        if self.router_back_at == 0.0:  # up until now (a retry that fails again says nothing more)
            rank_zero_warn(
                f"VLLMServer: the router {self.router} (router_url) does not answer ({err}). Requests go straight "
                f"to the {len(self.live)} live servers, which serve them; the router gets a request again every "
                f"{ROUTER_RETRY_SECONDS:g} s (train/servers/router/down is 1 meanwhile). Start it again, or unset "
                "router_url"
            )
        self.router_back_at = time.monotonic() + ROUTER_RETRY_SECONDS

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

    def _failed(self, target: str, groups: int, why: str, err: Unreachable) -> None:
        with self.lock:
            self.retried_groups += groups
            self.failures.append(why)
            if target != "router":
                self.live.discard(int(target))
            elif isinstance(err, NoAnswer):  # the router itself; a 5xx through it is its server's failure
                self._router_down(err)

    def take_metrics(self) -> dict[str, float]:
        """This step's ``servers/*`` metrics (requests by target, groups sent again), the counts then reset."""
        with self.lock:
            metrics = {f"servers/{name}/requests": float(count) for name, count in self.requests.items()}
            if self.router is None:
                metrics.pop("servers/router/requests")
            else:
                metrics["servers/router/failed"] = float(self.router_failed)
                metrics["servers/router/down"] = float(self.router_back_at > 0.0)
            metrics["servers/retried_groups"] = float(self.retried_groups)
            metrics["servers/restarted"] = float(self.restarted)
            if self.turns:  # a step that served agent episodes
                metrics["servers/moved_sessions"] = float(self.moved_sessions)
            self.requests = dict.fromkeys(self.requests, 0)
            self.retried_groups, self.failures, self.moved_sessions, self.turns = 0, [], 0, 0
            self.router_failed = 0
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
