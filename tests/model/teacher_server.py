"""A teacher's server for the tests: the HTTP surface of ``vllm serve`` that ``model/served_teacher.py`` calls, on a
real aiohttp server in a thread, scoring with a real Hugging Face model.

- ``GET /v1/models``: one model card, ``id`` the served name, ``root`` the model's path (vLLM's ``ModelCard``);
- ``POST /tokenize``: ``{"tokens": [...], "count", "max_model_len"}`` by the server's tokenizer (vLLM's
  ``TokenizeResponse``);
- ``POST /v1/completions`` with token-id prompts and ``prompt_logprobs: 0``: each choice's ``prompt_logprobs``, ``None``
  first, then ``{id: {"logprob", "rank", "decoded_token"}}`` for each given token; a request naming another model
  is answered 404, as vLLM answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import torch
from aiohttp import web
from transformers import AutoModelForCausalLM, AutoTokenizer


def prompt_logprobs(model, tokens: list[int]) -> list[dict | None]:
    with torch.no_grad():
        logps = model(input_ids=torch.tensor([tokens])).logits[0].float().log_softmax(-1)  # [L, V]
    entries: list[dict | None] = [None]
    for position in range(1, len(tokens)):
        token = tokens[position]
        value = float(logps[position - 1, token])
        rank = int((logps[position - 1] > value).sum()) + 1
        entries.append({str(token): {"logprob": value, "rank": rank, "decoded_token": ""}})
    return entries


def app(model_dir: str, served_name: str, tokenizer_dir: str) -> web.Application:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    async def models(request: web.Request) -> web.Response:
        card = {"id": served_name, "object": "model", "owned_by": "vllm", "root": model_dir, "max_model_len": 512}
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        tokens = tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)).input_ids
        return web.json_response({"count": len(tokens), "max_model_len": 512, "tokens": tokens})

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("model") != served_name:
            message = f"The model `{body.get('model')}` does not exist."
            return web.json_response({"error": {"message": message, "code": 404}}, status=404)
        choices = [
            {"index": i, "text": "", "prompt_logprobs": prompt_logprobs(model, tokens)}
            for i, tokens in enumerate(body["prompt"])
        ]
        return web.json_response({"object": "text_completion", "model": served_name, "choices": choices})

    application = web.Application()
    application.router.add_get("/v1/models", models)
    application.router.add_post("/tokenize", tokenize)
    application.router.add_post("/v1/completions", completions)
    return application


@contextlib.contextmanager
def serving(model_dir: str, served_name: str | None = None, tokenizer_dir: str | None = None) -> Iterator[str]:
    """The base URL of a server of ``model_dir`` (under ``served_name``, default its path, as ``vllm serve`` names
    it; tokenizing with ``tokenizer_dir``'s tokenizer, default the model's), for the ``with`` block."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app(model_dir, served_name or model_dir, tokenizer_dir or model_dir))
    loop.run_until_complete(runner.setup())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop.run_until_complete(web.SockSite(runner, sock).start())
    port = sock.getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()
