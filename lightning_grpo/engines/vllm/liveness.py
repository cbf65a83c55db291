"""Which of ``VLLMServer``'s servers serve, and with what: each waited for at start (one model for all), its weight
channel opened (``"nccl"``), and at each weight sync the push to the live ones, a server taken out by any rank
agreed on by every rank, one answering ``/health`` again caught up with the current weights (under ``"nccl"`` a
new weight channel first) before it serves, the router told who left and who came back. Rank 0 talks to the
servers; every rank ends the sync knowing the same live servers. Knows the control plane (``control.py``), the
push (``sync.py``) and the ranks' collectives (``agree.py``); nothing about sampling.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.vllm import channel
from lightning_grpo.engines.vllm.agree import all_ranks, bounded_barrier, scatter_from_zero
from lightning_grpo.engines.vllm.control import OUT_HEALTH_SECONDS, OUT_QUIET_SECONDS, NoServerLeft
from lightning_grpo.engines.vllm.sync import push_metrics
from lightning_grpo.model.policy import Policy


class ServerLiveness(RolloutEngine):
    """``VLLMServer``'s servers over a run: its ``sync_weights`` and the bookkeeping of the servers in and out of
    service around it. A part of ``VLLMServer``, whose ``__init__`` and ``setup`` set what it reads: ``urls``,
    ``controls`` (rank 0's control plane), ``pool`` (this rank's data plane), ``weight_sync``, ``routed``, the
    rank, the settings (``weight_transfer``, ``group_port``, the timeouts) and the step last synced."""

    def _served_model(self) -> str:
        """The model every server serves (each waited for up to ``connection_timeout``); a ``ValueError`` naming
        the servers when they serve different ones."""
        served = {}
        for control in self.controls:
            deadline = time.monotonic() + self.connection_timeout
            while not control.healthy() and time.monotonic() < deadline:
                time.sleep(1.0)
            if not control.healthy():
                raise ConnectionError(
                    f"VLLMServer: the server {control.url} did not answer /health within connection_timeout "
                    f"{self.connection_timeout:g} s (rank {self.rank}). Start it (python -m "
                    "lightning_grpo.engines.vllm.launch MODEL --port P) or remove it from base_url"
                )
            served[control.url] = control.served_models()[0]
        if len(set(served.values())) != 1:
            raise ValueError(f"VLLMServer base_url: the servers must serve one model, they serve {served}")
        for control in self.controls:
            control.base_model = control.model = served[control.url]
        return served[self.urls[0]]

    def open_clients(self, device: torch.device) -> None:
        """Rank 0: a TRL client per server, each joined to its server's NCCL weight-update group (ports
        ``group_port``, ``group_port + 1`` ...)."""
        for i, control in enumerate(self.controls):
            control.client = self.joined_client(i, device)

    def joined_client(self, i: int, device: torch.device) -> Any:
        """A TRL client of server ``i`` joined to a new weight-update group on port ``group_port + i``."""
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(
            base_url=self.urls[i], group_port=self.group_port + i, connection_timeout=self.connection_timeout
        )
        channel.bound_requests(client, self.sync_timeout)
        self.open_weight_channel(client, device)
        return client

    def reopen_channel(self, i: int, device: torch.device) -> bool:
        """Rank 0, ``"nccl"``: server ``i``, answering again after an outage, joined to a new weight-update group on
        its port (a restarted server left the old one; ``channel.close`` lets it go), within ``sync_timeout``
        seconds. Whether it opened; when not, why is logged and the server stays out until a later sync."""
        control = self.controls[i]
        channel.close(control.client)
        control.client = None
        port = self.group_port + i
        try:
            what = f"joining the weight-update group of {control.url} (port {port})"
            joined = channel.within(self.sync_timeout, what, lambda: self.joined_client(i, device), channel.close)
            control.client = joined
        except Exception as err:  # any failure of TRL's or vLLM's: the server stays out, the run goes on
            rank_zero_warn(
                f"VLLMServer: the server {control.url} answers /health again, but its weight channel "
                f"(weight_transfer='nccl', group_port {port}) did not open at the sync of step {self.synced_step}: "
                f"{type(err).__name__}: {err}. It stays out of service (sync_timeout {self.sync_timeout:g} s); "
                "the next sync tries again"
            )
            return False
        return True

    def open_weight_channel(self, client: Any, device: torch.device) -> None:
        """Join one server's weight-update group (rank 0 of it; the server's workers follow)."""
        client.init_communicator(device=device)

    def agree_on(self, failed: NoServerLeft | None) -> None:
        """``NoServerLeft`` on every rank when any rank's requests found no server left, with every rank's reason:
        raised on one rank alone, the others would wait in the step's next collective, and no checkpoint could be
        written. The ranks generate in step, so this is one small gather a step (none in ``AsyncRollouts``'
        producer, a copy without the trainer, whose failure its own rank raises)."""
        if self.trainer is None or self.world_size == 1:
            if failed is not None:
                raise failed
            return
        reasons = [why for why in all_ranks(None if failed is None else str(failed), self.world_size) if why]
        if reasons:
            raise NoServerLeft(" | ".join(reasons), every_rank=True) from failed

    @override
    def sync_weights(self, policy: Policy) -> None:
        """Send the policy's weights (or its adapter) to every live server and check each (``WeightSync``); a
        server back in service gets them too before it serves again. Every rank calls it: the ranks agree on the
        live servers, a sharded policy is gathered first (a collective); rank 0 talks to the servers while the
        others wait, at most ``sync_timeout`` seconds. Rank 0 reads each server's process (``process_start``)
        before pushing to it: the ranks check it before each step's requests (``ServerPool.check_restarts``), so
        a server restarted after its push serves nothing before it has the weights again; under ``"nccl"`` one
        restarted since the last sync (its weight-update group gone) joins a new group first (``reopen_channel``)."""
        self.synced_step = self.trainer.global_step
        agreed = self._agreed_live()
        started = self._process_starts(agreed)  # before the push: a restart after it shows
        out, back = self.from_rank_zero(self._outage(agreed, started, policy.device) if self.rank == 0 else None)
        live = {str(i): self.controls[i] for i in range(len(self.urls)) if i not in out}
        self.weight_sync(policy, live, self.synced_step)
        lost = dict(self.weight_sync.unreachable)  # server -> what failed (rank 0's, on every rank)
        started |= self._process_starts(set(back))
        self.weight_sync.catch_up(policy, {str(i): self.controls[i] for i in back}, self.synced_step)
        returned = set(back) - set(map(int, self.weight_sync.unreachable))
        live = (set(range(len(self.urls))) - out - set(map(int, lost))) | returned
        for i in set(range(len(self.urls))) - live:  # logged as nothing moved (a logger would repeat the last push)
            self.weight_sync.metrics.update(push_metrics(0, 0.0, str(i)))
        for name, why in {**lost, **self.weight_sync.unreachable}.items():  # a push, a catch-up or a probe lost it
            rank_zero_warn(
                f"VLLMServer: the server {self.urls[int(name)]} is out of service from the weight sync of step "
                f"{self.synced_step}: {why}. Requests go to the {len(live)} live of {len(self.urls)} servers; it "
                "gets the current weights at a later sync, once it answers /health again (asked at each sync for "
                f"at most {OUT_HEALTH_SECONDS:g} s, and not for {OUT_QUIET_SECONDS:g} s after it leaves one unanswered)"
            )
        self._serve(live, started)
        bounded_barrier(self.sync_timeout, f"VLLMServer's weight sync of step {self.synced_step}", self.world_size)

    def _outage(self, agreed: set[int], started: dict[int, float | None], device: torch.device):
        """Rank 0: the servers out of this sync's push (taken out by a rank since the last sync) and those of them
        back in service: answering ``/health`` again. Under ``"nccl"`` a weight-update group is one process's: a
        server that is another process than the one the last sync reached (restarted, and no request noticed) is
        out too, and one comes back only once it has joined a new group (``reopen_channel``)."""
        out = set(range(len(self.urls))) - agreed
        if self.weight_transfer == "disk":
            return out, self._answering(out)
        was = self.pool.started
        out |= {i for i, now in started.items() if now is not None and was.get(i) not in (None, now)}
        return out, [i for i in self._answering(out) if self.reopen_channel(i, device)]

    def _answering(self, out: set[int]) -> list[int]:
        """Rank 0: the servers of ``out`` that answer ``/health`` again."""
        return [i for i in sorted(out) if self.controls[i].answers_again()]

    def _process_starts(self, servers: set[int]) -> dict[int, float | None]:
        """Rank 0: each server's ``process_start`` (one ``GET /metrics`` each); empty elsewhere."""
        return {i: self.controls[i].process_start() for i in sorted(servers)} if self.rank == 0 else {}

    def _agreed_live(self) -> set[int]:
        """The servers no rank has taken out since the last sync."""
        live = self.pool.live
        for other in all_ranks(sorted(live), self.world_size):
            live = live & set(other)
        return live

    def _serve(self, live: set[int], started: dict[int, float | None]) -> None:
        """From now on requests go to ``live`` (every rank: computed from rank 0's answers), whose processes are
        ``started`` (rank 0's), and name what the live servers serve (the adapter version loaded last); the router
        is told who left and who came back since it was last told (not since the pool's ``live``: a failed request
        already took its server out of that). ``NoServerLeft`` when none is live."""
        if self.rank == 0:
            for i in range(len(self.urls)):
                if (i in live) != (i in self.routed):
                    self.pool.tell_router("add_worker" if i in live else "remove_worker", self.urls[i])
            self.routed = set(live)
        served = self.controls[min(live)].model if self.rank == 0 and live else None  # the adapter loaded last
        served, started = self.from_rank_zero((served, {i: started.get(i) for i in live}))
        self.pool.expect(live, started)
        self.model_name = served or self.base_model
        if not live:  # every rank: from rank 0's answers
            raise NoServerLeft(
                f"VLLMServer: no server answers after the weight sync of step {self.synced_step} "
                f"(base_url {self.urls}); restart them and resume from the checkpoint",
                every_rank=True,
            )

    def from_rank_zero(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return scatter_from_zero([value] * self.world_size if self.rank == 0 else None, self.rank, self.world_size)
