"""A stand-in for ``trl vllm-serve`` on CPU: the HTTP endpoints TRL 1.16's ``VLLMClient`` calls, served by the
standard library, generating with Hugging Face ``generate`` on a real model.

``python vllm_fake_server.py MODEL_DIR PORT [--no-weight-transfer]``. Endpoints, as vLLM's server answers them:
- ``GET /health``, ``GET /v1/models``, ``GET /get_world_size``, ``GET /server_info`` (a weight-transfer config;
  with ``--no-weight-transfer`` none, as a server started without ``--weight-transfer-config`` answers),
  ``GET /metrics`` (Prometheus text: the process's ``process_start_time_seconds`` alone);
- ``POST /v1/completions``: token-id prompts, ``n`` completions each (prompt-major), sampled with the request's
  seed, with each sampled token's processed log-prob (after temperature, top-k/p: ``--logprobs-mode
  processed_logprobs``) as ``token_id:<id>`` entries (``return_tokens_as_token_ids``); a request naming another
  model than the server's answered 404 "The model `X` does not exist." as vLLM answers it;
- ``POST /init_weight_transfer_engine``: connects to the trainer's group (``init_info``'s address and port);
  ``/start_weight_update``, ``/update_weights`` (receives the announced tensors from the stream, checks each
  name, dtype and shape, and loads it), ``/finish_weight_update``; ``POST /reset_prefix_cache``;
- ``POST /stall``: the next ``/update_weights`` neither reads the stream nor answers (a server hung mid-transfer);
- ``POST /collective_rpc`` with ``reload_weights`` (the ``"disk"`` transfer: ``model.safetensors`` of the folder
  ``weights_path``, every name checked and loaded).
The weight stream is the TCP stand-in of ``tests/engines/vllm/vllm_stand_in`` (vLLM streams over NCCL).
For the tests: ``GET /stats`` (what was asked and received, each completion request's ``X-Session-ID``, and
``log``: ``"generate"`` and ``"weights"`` in the order they happened),
``POST /save`` (the weights, to a file) and ``POST /exit`` (answers, then the process ends at once: a server that
dies).
"""

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).with_name("vllm_stand_in")))
from vllm.distributed.weight_transfer.packed_tensor import read_tensor  # noqa: E402


class Server:
    def __init__(self, model_dir: str, weight_transfer: bool = True) -> None:
        self.name, self.weight_transfer = model_dir, weight_transfer
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
        self.pad = self.model.generation_config.pad_token_id or self.eos
        self.lock = threading.Lock()
        self.stream: socket.socket | None = None
        self.stats = {
            "generate_requests": [],
            "sampling_options": [],
            "models_requests": 0,
            "weight_updates": 0,
            "tensors_received": 0,
            "sessions": [],  # each /v1/completions request's X-Session-ID header (None: not sent)
            "log": [],  # "generate" (a completion request) and "weights" (an update finished), in order
        }
        self.updating = False
        self.stalls = 0  # /update_weights calls still to hang (POST /stall)
        self.started = time.time()  # vLLM's /metrics: Prometheus' process_start_time_seconds

    def completions(self, body: dict) -> dict:
        if body.get("model", self.name) != self.name:  # vLLM's answer to a model (an adapter) it does not serve
            raise LookupError(f"The model `{body['model']}` does not exist.")
        prompts, n = body["prompt"], body.get("n", 1)
        self.stats["generate_requests"].append({"prompts": len(prompts), "n": n})
        self.stats["log"].append("generate")
        self.stats["sampling_options"].append(body.get("skip_special_tokens"))  # from sampling.generation_kwargs
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        temperature = body.get("temperature", 1.0)
        sampling = {"do_sample": temperature > 0}
        if temperature > 0:
            sampling.update(temperature=temperature, top_p=body.get("top_p", 1.0), top_k=body.get("top_k") or None)
            sampling.update(min_p=body.get("min_p") or None)
        if "seed" in body:
            torch.manual_seed(body["seed"])
        with self.lock, torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=body.get("max_tokens", 16),
                num_return_sequences=n,
                repetition_penalty=body.get("repetition_penalty", 1.0),
                output_scores=True,  # the processed scores the token was sampled from
                return_dict_in_generate=True,
                pad_token_id=self.pad,
                eos_token_id=self.eos,
                **sampling,
            )
        new = out.sequences[:, width:]  # [N, T]
        logps = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [N, T]
        return {"choices": [self.choice(i, prompts[i // n], new[i], logps[i]) for i in range(len(new))]}

    def choice(self, index: int, prompt: list[int], tokens: torch.Tensor, logps: torch.Tensor) -> dict:
        ids = tokens.tolist()
        length = ids.index(self.eos) + 1 if self.eos in ids else len(ids)  # up to and including EOS
        names = [f"token_id:{t}" for t in ids[:length]]
        values = logps[:length].tolist()
        return {
            "index": index,
            "text": "",
            "prompt_token_ids": prompt,
            "token_ids": ids[:length],
            "finish_reason": "stop" if self.eos in ids[:length] else "length",
            "logprobs": {
                "tokens": names,
                "token_logprobs": values,
                "top_logprobs": [{name: value} for name, value in zip(names, values)],
            },
        }

    def connect(self, init_info: dict) -> dict:
        deadline = time.monotonic() + 60
        while True:  # the trainer opens its end while this request is in flight
            try:
                self.stream = socket.create_connection((init_info["master_address"], init_info["master_port"]))
                return {}
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def update(self, info: dict) -> dict:
        if not self.updating:
            raise ValueError("/update_weights outside /start_weight_update ... /finish_weight_update")
        if self.stalls:
            self.stalls -= 1
            threading.Event().wait()  # for good: the trainer must give up on its own
        state = self.model.state_dict()
        with self.lock, torch.no_grad():
            for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
                tensor = read_tensor(self.stream)
                if name not in state:
                    raise ValueError(f"unknown weight {name!r}")
                if str(tensor.dtype).removeprefix("torch.") != dtype or list(tensor.shape) != shape:
                    raise ValueError(f"{name}: announced {dtype} {shape}, got {tensor.dtype} {list(tensor.shape)}")
                state[name].copy_(tensor)
                self.stats["tensors_received"] += 1
        return {}

    def reload(self, kwargs: dict) -> dict:
        from safetensors.torch import load_file

        weights = load_file(str(Path(kwargs["weights_path"]) / "model.safetensors"))
        with self.lock, torch.no_grad():
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if missing or set(unexpected) - {"lm_head.weight"}:  # the tied head comes under its own name too
                raise ValueError(f"reload_weights: missing {missing}, unexpected {unexpected}")
        self.stats["weight_updates"] += 1
        self.stats["log"].append("weights")
        return {}

    def post(self, path: str, body: dict) -> dict:
        if path == "/v1/completions":
            return self.completions(body)
        if path == "/collective_rpc" and body.get("method") == "reload_weights":
            return self.reload(body["kwargs"])
        if path == "/init_weight_transfer_engine":
            return self.connect(body["init_info"])
        if path == "/start_weight_update":
            self.updating = True
            return {}
        if path == "/update_weights":
            return self.update(body["update_info"])
        if path == "/finish_weight_update":
            self.updating = False
            self.stats["weight_updates"] += 1
            self.stats["log"].append("weights")
            return {}
        if path == "/stall":
            self.stalls += 1
            return {}
        if path == "/reset_prefix_cache":
            return {"success": True}
        if path == "/exit":
            return {}
        if path == "/save":
            torch.save(self.model.state_dict(), body["path"])
            return {}
        raise LookupError(path)

    def get(self, path: str) -> dict | str:
        if path == "/health":
            return {}
        if path == "/v1/models":
            self.stats["models_requests"] += 1
            return {"data": [{"id": self.name}]}
        if path == "/get_world_size":
            return {"world_size": 1}
        if path.startswith("/server_info"):
            return {"vllm_config": {"weight_transfer_config": {"backend": "nccl"} if self.weight_transfer else None}}
        if path == "/stats":
            return self.stats
        if path == "/metrics":
            return f"process_start_time_seconds {self.started:.2f}\n"
        raise LookupError(path)


def handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer(lambda: server.get(self.path))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/v1/completions":  # the agent episode (vllm-router's session header)
                server.stats["sessions"].append(self.headers.get("X-Session-ID"))
            self.answer(lambda: server.post(self.path, body))

        def answer(self, respond) -> None:
            try:
                status, payload = 200, respond()
            except LookupError as err:
                status, payload = 404, {"error": f"not found: {err}"}
            except Exception as err:  # the client raises on any non-200 with this text
                status, payload = 400, {"error": f"{type(err).__name__}: {err}"}
            text = isinstance(payload, str)  # /metrics: Prometheus' text format
            data = (payload if text else json.dumps(payload)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            if self.path == "/exit":
                self.wfile.flush()
                os._exit(0)

        def log_message(self, *args) -> None:
            pass

    return Handler


def main(model_dir: str, port: str, *flags: str) -> None:
    torch.set_num_threads(1)
    server = Server(model_dir, weight_transfer="--no-weight-transfer" not in flags)
    http = ThreadingHTTPServer(("127.0.0.1", int(port)), handler(server))
    print(f"serving {model_dir} on port {port}", flush=True)
    http.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
