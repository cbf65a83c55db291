"""``engines/vllm/channel.py``: opening a server's weight channel again is bounded in time. Letting a group go and
joining a new one on the same port, against a restarted fake server over the stand-in's stream:
``tests/engines/vllm/test_servers.py``'s ``test_ddp_nccl_a_restarted_server_...``."""

import socket
import threading
import time
from types import SimpleNamespace

import pytest
import requests

from lightning_grpo.engines.vllm.channel import bound_requests, within


def test_within_gives_the_value_or_the_error_and_gives_up_on_an_action_that_hangs():
    assert within(5, "an answer", lambda: 42) == 42
    with pytest.raises(ConnectionRefusedError, match="refused"):
        within(5, "a refusal", lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")))
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"joining the group of http://s:1 \(port 7\) did not finish within 0.3 s"):
        within(0.3, "joining the group of http://s:1 (port 7)", lambda: release.wait(60))
    assert time.monotonic() - start < 5  # not the 60 s the action waits: it is left behind in its daemon thread
    release.set()


def test_what_an_action_that_timed_out_returns_later_is_handed_to_abandon():
    """A group joined after its caller gave up would hold its port: ``abandon`` lets it go."""
    release, abandoned = threading.Event(), []
    with pytest.raises(TimeoutError):
        within(0.2, "a late join", lambda: release.wait(60) and "late group", abandoned.append)
    release.set()
    for _ in range(100):
        if abandoned:
            break
        time.sleep(0.05)
    assert abandoned == ["late group"]
    assert within(5, "an early join", lambda: "group", abandoned.append) == "group" and abandoned == ["late group"]


def test_a_weight_client_s_requests_end_at_the_bound_and_are_tried_once():
    """TRL's client sets no timeout and retries read timeouts of POSTs five times: a hung server would keep a
    ``/update_weights`` (sent again without its broadcast) waiting for good."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def hang() -> None:  # accepts, reads, never answers
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(connection)

    threading.Thread(target=hang, daemon=True).start()
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(max_retries=requests.adapters.Retry(total=5, read=5)))
    client = bound_requests(SimpleNamespace(session=session), 0.5)
    start = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        client.session.post(f"http://127.0.0.1:{listener.getsockname()[1]}/update_weights", json={})
    assert time.monotonic() - start < 3 and len(accepted) == 1
    listener.close()
