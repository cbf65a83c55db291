#!/usr/bin/env bash
# What only a GPU proves, on one H100. Each part has its own time limit and log; one that fails leaves the others.
# The parts of issue 45, in two calls of under 10 minutes (TRL's generate of 512 tokens needs most of a part):
#     ONLY="graphed decode_step host_syncs trl_05b trl_vs_ours" bash benchmarks/gpu_checks.sh
#     ONLY="trl_05b_lora profile_step" bash benchmarks/gpu_checks.sh
# The earlier parts (the selfcheck's GPU rows, the log-prob layouts on CUDA, how long a completion one GPU trains):
#     ONLY="selfcheck padding_tiny long_context padding_qwen padding_flex" bash benchmarks/gpu_checks.sh
# Logs under gpu_results/ (or $OUT), the tables on stdout; no ONLY runs every part (more than one 10-minute call).
#
# Needs the package's requirements (trl for the last part) and a CUDA GPU. No downloads: every model is built here.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_results}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1
export LIGHTNING_GRPO_HOME=${LIGHTNING_GRPO_HOME:-/tmp/lightning_grpo_home}

part() {  # part NAME SECONDS COMMAND...: run it under a time limit, its whole output to $out/NAME.log
    local name=$1 limit=$2
    shift 2
    [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0  # ONLY="selfcheck long_context": just those
    echo "=== $name ($*)"
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    grep -v -e "Loading weights" -e "Writing model shards" -e "^\s*$" "$out/$name.log" | tail -n "${TAIL:-25}"
    echo "=== $name: exit $rc in $((SECONDS - start)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'lightning', lightning.__version__)"
part graphed 60 $py -m pytest -q -p no:cacheprovider -o addopts="" tests/engines/decode/test_graphed.py
# the captured decode step failed its checks: the side-by-sides run LeanDecode without it (said in the log)
graphs=--cuda-graphs
grep -qE "[0-9]+ (failed|error)" "$out/graphed.log" 2>/dev/null && graphs=--no-cuda-graphs && echo "graphs off: $graphs"
part decode_step 45 $py benchmarks/bench_decode_cuda.py --rows 8 64
part host_syncs 60 $py -m pytest -q -s -p no:cacheprovider -o addopts="" tests/test_host_syncs.py
# issue 58 item 12: every collective of a step on the module's device, the two ranks' process group cuda:gloo (CUDA
# only, as NCCL is); on a CPU machine the same test runs cpu:gloo, which cannot see a host tensor in a collective
part ranks_devices 120 $py -m pytest -q -p no:cacheprovider -o addopts="" tests/test_ranks_devices.py
part trl_05b 300 $py benchmarks/trl_vs_lightning_grpo.py --model qwen0.5b --device cuda --bf16 $graphs --betas 0 \
    --repeats 1 --steps 2 --warmup 1 --json "$out/trl_05b.json"
part trl_05b_lora 300 $py benchmarks/trl_vs_lightning_grpo.py --model qwen0.5b --device cuda --bf16 --lora 16 \
    $graphs --betas 0 --repeats 1 --steps 2 --warmup 1 --json "$out/trl_05b_lora.json"
part trl_15b 200 $py benchmarks/trl_vs_lightning_grpo.py --model qwen1.5b --device cuda --bf16 $graphs --betas 0 \
    --repeats 1 --steps 2 --warmup 1 --json "$out/trl_15b.json"
part selfcheck 90 $py -m lightning_grpo selfcheck --only bf16,offload
part padding_tiny 50 $py benchmarks/bench_padding.py --device cuda
part long_context 100 $py benchmarks/bench_long_context.py --lengths 4096 8192 16384 32768 65536
part padding_qwen 90 $py benchmarks/bench_padding.py --device cuda --model qwen0.5b --dtype bfloat16 \
    --prompts 1 --group 8 --lengths 64-4096 --budget 16384 --repeats 3
part trl_vs_ours 90 $py benchmarks/trl_vs_lightning_grpo.py --model gen --device cuda $graphs --betas 0 --repeats 1 \
    --steps 5 --warmup 1 --json "$out/trl_vs_ours.json"
part profile_step 60 $py benchmarks/profile_step.py --model gen --device cuda
part padding_flex 60 $py benchmarks/bench_padding.py --device cuda --model qwen0.5b --dtype bfloat16 \
    --prompts 1 --group 8 --lengths 64-4096 --budget 16384 --repeats 3 --attn flex_attention \
    --layouts "padded, one pass" "micro_batch_tokens, rows" "padding_free, one pass"
