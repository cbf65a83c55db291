"""HTTP requests in the OpenAI API's shapes -> ``Request`` objects for the engine, and its answers -> HTTP replies.

An aiohttp server on 127.0.0.1 that runs on its own thread and event loop, so the trainer's thread stays free to
generate. Every request names its episode, in the base URL (``/sessions/<id>/v1``) or in an ``X-Episode-Id`` header,
and is handed to the engine's ``accept`` callback, which refuses it (unknown or ended episode, a setting we do
not serve) or queues it; the engine answers each queued request once, from any thread. Knows HTTP and the API's
field names; nothing about models or tokens.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SESSION_HEADER = "X-Episode-Id"
MODEL_NAME = "policy"  # what /v1/models lists; requests may name any model: there is one


class Refusal(Exception):
    """A request the endpoint will not serve: an HTTP status and a message that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Request:
    """One ``/chat/completions`` (``kind="chat"``) or ``/completions`` (``kind="completion"``) request."""

    session: str
    kind: str
    body: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)

    def answer(self, reply: dict[str, Any] | Refusal) -> None:
        """Resolve the request (thread-safe); a second answer is ignored."""

        def resolve() -> None:
            if not self.future.done():
                self.future.set_result(reply)

        self.loop.call_soon_threadsafe(resolve)


def chat_reply(content: str, tool_calls: list[dict], finish_reason: str, usage: tuple[int, int], extra: dict) -> dict:
    """A ``chat.completion`` object: tool calls as the API shapes them (arguments as a JSON string, an id each)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return _completion("chat.completion", {"message": message, "finish_reason": finish_reason, **extra}, usage)


def text_reply(text: str, finish_reason: str, usage: tuple[int, int], extra: dict) -> dict:
    """A ``text_completion`` object."""
    return _completion("text_completion", {"text": text, "finish_reason": finish_reason, **extra}, usage)


def _completion(kind: str, choice: dict[str, Any], usage: tuple[int, int]) -> dict[str, Any]:
    prompt, completion = usage
    return {
        "id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [{"index": 0, "logprobs": None, **choice}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status)


class Endpoint:
    """The server. ``start(accept)`` binds a free port (or ``port``) and returns once it listens.

    Args:
        host: the address to bind; 127.0.0.1 keeps it to this machine (the agents run here).
        port: 0 picks a free port.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accept: Callable[[Request], None] | None = None
        self._runner: Any = None

    def base_url(self, session: str) -> str:
        """The OpenAI base URL of one episode: ``OpenAI(base_url=...)`` needs nothing else."""
        return f"http://{self.host}:{self.port}/sessions/{session}/v1"

    def start(self, accept: Callable[[Request], None]) -> None:
        if self.loop is not None:
            return
        self.accept, ready = accept, threading.Event()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._serve, args=(ready,), name="agent-endpoint", daemon=True).start()
        if not ready.wait(30) or self._runner is None:
            raise RuntimeError(f"the agent endpoint did not start on {self.host}:{self.port}")

    def stop(self) -> None:
        if self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop = None

    def _serve(self, ready: threading.Event) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=64 * 2**20)
        for prefix in ("/sessions/{session}/v1", "/v1"):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_post(prefix + "/completions", self._text)
            app.router.add_get(prefix + "/models", self._models)
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, self.host, self.port)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # the port bound when 0 was asked
        self._runner = runner
        ready.set()
        self.loop.run_forever()

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "me"}]})

    async def _chat(self, request: Any) -> Any:
        return await self._handle(request, "chat")

    async def _text(self, request: Any) -> Any:
        return await self._handle(request, "completion")

    async def _handle(self, http: Any, kind: str) -> Any:
        from aiohttp import web

        session = http.match_info.get("session") or http.headers.get(SESSION_HEADER)
        if not session:
            return _error(400, f"name the episode: base URL .../sessions/<id>/v1 or an {SESSION_HEADER} header")
        try:
            body = await http.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        request = Request(session, kind, body, self.loop, self.loop.create_future())
        try:
            self.accept(request)
            reply = await request.future
        except Refusal as refusal:
            reply = refusal
        if isinstance(reply, Refusal):
            return _error(reply.status, reply.message)
        return web.json_response(reply)
