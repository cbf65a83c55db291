"""HTTP requests in the OpenAI API's shapes -> ``Request`` objects for the engine, and its answers -> HTTP replies.

An aiohttp server on 127.0.0.1 that runs on its own thread and event loop, so the trainer's thread stays free to
generate. Every request names its episode, in the base URL (``/sessions/<id>/v1``) or in an ``X-Episode-Id`` header,
and its body is a JSON object whose fields have the API's shapes (else a 400 names the field: ``check_body``). It
is handed to the engine's ``accept`` callback, which refuses it (an unknown or ended episode) or queues it; the
engine answers each queued request once, from any thread. ``stop`` answers what is still waiting (503) before it
closes. Knows HTTP and the API's field names; nothing about models or tokens.
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
    """A request the endpoint will not serve: an HTTP status, a message that says why and, as the OpenAI API names
    them, the request's field at fault (``param``) and an error ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(eq=False)  # hashed by identity: the endpoint keeps the ones waiting in a set
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


def check_body(kind: str, body: dict[str, Any]) -> None:
    """Refuse (400, naming the field) a ``/chat/completions`` (``kind="chat"``) or ``/completions`` body whose
    fields have shapes the API does not accept, or settings we do not serve (``stream``, ``n`` > 1)."""
    problem = _served_problem(body) or (_chat_problem(body) if kind == "chat" else _prompt_problem(body))
    if problem is not None:
        raise Refusal(400, f"{problem[0]} {problem[1]}", param=problem[0])


Problem = tuple[str, str]  # the field, what is wrong with it
MESSAGE, PART = "{'role': ..., 'content': ...}", "{'type': 'text', 'text': ...}"
TOOL, CALL = "{'type': 'function', 'function': {'name': ...}}", "{'function': {'name': ..., 'arguments': ...}}"


def _got(value: Any) -> str:
    shown = repr(value)
    return f"got {type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def _served_problem(body: dict[str, Any]) -> Problem | None:
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return name, f"must be a positive integer or null, {_got(value)}"
    if body.get("stream"):
        return "stream", "is not served (stream=true): the endpoint answers whole replies"
    if body.get("n") not in (None, 1):
        return "n", f"must be 1: one completion a request (GRPO's G samples are G episodes), {_got(body.get('n'))}"
    return None


def _chat_problem(body: dict[str, Any]) -> Problem | None:
    messages, tools = body.get("messages"), body.get("tools")
    if not isinstance(messages, list) or not messages:
        return "messages", f"must be a non-empty list of {MESSAGE} objects, {_got(messages)}"
    for i, message in enumerate(messages):
        problem = _message_problem(f"messages[{i}]", message)
        if problem is not None:
            return problem
    if tools is not None and not isinstance(tools, list):
        return "tools", f"must be a list of {TOOL} objects, {_got(tools)}"
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tools[{i}]", f"must be {TOOL}, {_got(tool)}"
    return None


def _message_problem(where: str, message: Any) -> Problem | None:
    if not isinstance(message, dict):
        return where, f"must be an object {MESSAGE}, {_got(message)}"
    if not isinstance(message.get("role"), str):
        return f"{where}.role", f"must be a string, {_got(message.get('role'))}"
    content = message.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
    )
    if not (content is None or isinstance(content, str) or parts_ok):
        return f"{where}.content", f"must be a string, null or a list of {PART}, {_got(content)}"
    for name in ("name", "tool_call_id"):
        if message.get(name) is not None and not isinstance(message[name], str):
            return f"{where}.{name}", f"must be a string, {_got(message[name])}"
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        return f"{where}.tool_calls", f"must be a list of {CALL}, {_got(calls)}"
    for j, call in enumerate(calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"{where}.tool_calls[{j}]", f"must be {CALL}, {_got(call)}"
    return None


def _prompt_problem(body: dict[str, Any]) -> Problem | None:
    prompt = body.get("prompt")
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))):
        return "prompt", f"must be one string, {_got(prompt)}"
    return None


def _error(refusal: Refusal) -> Any:
    from aiohttp import web

    kind = "invalid_request_error" if refusal.status < 500 else "server_error"
    error = {"message": refusal.message, "type": kind, "param": refusal.param, "code": refusal.code}
    return web.json_response({"error": error}, status=refusal.status)


def refuse(requests: list[Request], why: str) -> None:
    """Answer each of ``requests`` 410 Gone with ``why``: the rollout that would have served them is over."""
    for request in requests:
        request.answer(Refusal(410, why))


class Endpoint:
    """The server. ``start(accept, port)`` binds ``port`` (0: a free one) and returns once it listens, or raises the
    bind's own error (a busy port) at once.

    Args:
        host: the address to bind; 127.0.0.1 keeps it to this machine (the agents run here).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accept: Callable[[Request], None] | None = None
        self._runner: Any = None
        self._failed: BaseException | None = None  # why the server thread could not listen
        self._waiting: set[Request] = set()  # requests whose handler awaits an answer (the loop's thread only)

    def base_url(self, session: str) -> str:
        """The OpenAI base URL of one episode: ``OpenAI(base_url=...)`` needs nothing else."""
        return f"http://{self.host}:{self.port}/sessions/{session}/v1"

    def start(self, accept: Callable[[Request], None], port: int = 0) -> None:
        """Listen on ``port`` (0: a free one); a port that cannot be bound raises its ``OSError`` here, at once."""
        if self.loop is not None:
            return
        self.accept, self.port, self._failed, ready = accept, port, None, threading.Event()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._serve, args=(ready,), name="agent-endpoint", daemon=True).start()
        started = ready.wait(30)  # set as soon as the server listens or could not
        if self._failed is not None or not started:
            self.loop = None
            raise self._failed or RuntimeError(f"the agent endpoint did not start on {self.host}:{port} in 30 s")

    def stop(self) -> None:
        """Answer every request still waiting (503: nothing will generate it now), then close; returns promptly."""
        if self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop = None

    async def _shutdown(self) -> None:
        for request in list(self._waiting):
            if not request.future.done():
                request.future.set_result(Refusal(503, "the agent endpoint is stopping: this request was not served"))
        await self._runner.cleanup()

    def _serve(self, ready: threading.Event) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=64 * 2**20)
        for prefix in ("/sessions/{session}/v1", "/v1"):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_post(prefix + "/completions", self._text)
            app.router.add_get(prefix + "/models", self._models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)  # stop() has answered every request
        try:
            self.loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            self.loop.run_until_complete(site.start())
        except BaseException as e:  # noqa: BLE001 - a busy port: start() raises it in the caller's thread
            self._failed = e
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()
            ready.set()
            return
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
            where = f"base URL .../sessions/<id>/v1 or an {SESSION_HEADER} header"
            return _error(Refusal(400, f"name the episode: {where}"))
        try:
            body = await http.json()
        except ValueError:
            return _error(Refusal(400, "the request body is not JSON"))
        if not isinstance(body, dict):
            return _error(Refusal(400, f"the request body must be a JSON object {{...}}, got {type(body).__name__}"))
        try:
            check_body(kind, body)
        except Refusal as refusal:
            return _error(refusal)
        request = Request(session, kind, body, self.loop, self.loop.create_future())
        self._waiting.add(request)
        try:
            self.accept(request)
            reply = await request.future
        except Refusal as refusal:
            reply = refusal
        finally:
            self._waiting.discard(request)
        if isinstance(reply, Refusal):
            return _error(reply)
        return web.json_response(reply)
