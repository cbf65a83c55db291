"""Rank 0's ``"nccl"`` weight channel to one server: TRL's ``VLLMClient`` joined to the server's weight-update group,
let go again when the server comes back from an outage or hangs in a push, and a new one joined in its place, each
within a bound of time.
Knows TRL's client and vLLM's trainer-side group; nothing about the policy or the other servers.

What a group holds on the trainer (vLLM's ``nccl_common.trainer_init``): a ``PyNcclCommunicator`` (an NCCL
communicator on the trainer's GPU) over a ``StatelessProcessGroup``, whose ``TCPStore`` server listens on the
group's port. A restarted server is another process: its side of the group is gone, and it joins only a new group,
whose rendezvous starts afresh (the old store still holds the old group's keys). So the old one is let go: the
communicator aborted (``ncclCommAbort``, which waits for no peer) and TRL's ``close_communicator``, which drops the
store, so that its port can be listened on again (vLLM sets ``SO_REUSEADDR``); the new group is opened on the same
port. Opening waits for the server's side (``/init_weight_transfer_engine``, the TCP rendezvous, NCCL's
``ncclCommInitRank``), none of them bounded by TRL, so it runs in a thread of its own given ``timeout`` seconds; one
that does not finish in time is left behind (a thread cannot be stopped) and holds the port until vLLM's store
gives up (300 s) or, should it join after all, until it is let go (``within``'s ``abandon``); tries on that port fail
at once meanwhile. A push through the group is bounded the same way (``ServerControl.stream``), and the client's
requests each by ``bound_requests``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def bound_requests(client: Any, timeout: float) -> Any:
    """``client`` (a TRL ``VLLMClient``, used for weights alone) with every HTTP request of its session bounded
    (``timeout`` seconds without an answer's bytes; TRL sets none) and tried once. TRL's retries (five, on read
    timeouts too, POSTs included) would send ``/update_weights`` again to a server that timed out, without the
    broadcast it waits for. A request left waiting on a server that hung (``within`` gave up on it) so ends too,
    and with it TRL's thread pool, which the interpreter waits for at exit."""
    from requests.adapters import HTTPAdapter

    class Bounded(HTTPAdapter):
        def send(self, request: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = kwargs.get("timeout") or timeout
            return super().send(request, **kwargs)

    for prefix in ("http://", "https://"):
        client.session.mount(prefix, Bounded(max_retries=0))
    return client


def close(client: Any) -> None:
    """Let go of ``client``'s weight-update group (a TRL ``VLLMClient``; ``None``: nothing to close): its NCCL
    communicator aborted where it has one to abort (vLLM's ``PyNcclCommunicator.destroy``), then TRL's
    ``close_communicator`` (drops the group's store and its port)."""
    communicator = getattr(client, "communicator", None)
    if communicator is None:
        return
    destroy = getattr(communicator, "destroy", None)  # vLLM's PyNcclCommunicator; TRL's close leaves it allocated
    if destroy is not None:
        destroy()
    client.close_communicator()


def within(timeout: float, what: str, action: Callable[[], T], abandon: Callable[[T], None] | None = None) -> T:
    """``action()``'s value when it returns within ``timeout`` seconds, its exception when it raises one; else a
    ``TimeoutError`` naming ``what``, ``action`` left running in a daemon thread (it cannot be stopped) and its value,
    should it come later, handed to ``abandon`` (a group joined too late is let go: it would hold its port).

    >>> within(5, "an answer", lambda: 42)
    42
    """
    done, lock, result = threading.Event(), threading.Lock(), {}

    def run() -> None:
        try:
            value = action()
        except BaseException as err:  # handed to the caller
            with lock:
                result["error"] = err
            done.set()
            return
        with lock:
            result["value"], late = value, result.get("late", False)
        done.set()
        if late and abandon is not None:
            abandon(value)

    threading.Thread(target=run, name=f"within: {what}", daemon=True).start()
    if not done.wait(timeout):
        with lock:
            if "value" not in result and "error" not in result:
                result["late"] = True
                raise TimeoutError(f"{what} did not finish within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]
