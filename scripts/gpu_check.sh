#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one command for a lent GPU machine with no network (reference/gpu.md).
#
#   here, once:         bash scripts/gpu_wheels.sh          # the missing wheels into .whl/ (git-ignored)
#   on the GPU machine: bash scripts/gpu_check.sh           # device tool: carry [".whl"], timeout_s 540
#   here, to try every Python part on a CPU at toy sizes (a few minutes; the CUDA graph's fixed-shape step runs
#   unrecorded as decode.py --static):  GPU_CHECK_SMOKE=1 GPU_CHECK_BUDGET=900 bash scripts/gpu_check.sh
#
# It installs the carried wheels with --no-index into /tmp/site (never touching the machine's torch), runs whileai
# from the checkout (PYTHONPATH=src; `pip install -e .` needs the network there), and prints one line per check:
#   1. the CUDA tests (tests/engine -k "cuda or gpu")
#   2. the embedded default run (`python -m whileai train --device cuda`)
#   3. the sampler against `generate` on a Qwen2.5-0.5B-shaped body (bf16, CUDA graph): batches of 1, 64 and 512
#      rows (64 prompts x 8 samples) x 128 tokens, time per decode step, tokens/s and peak memory per side (goal:
#      >= 4x generate's tokens/s at 64 x 8 x 128)
#   4. one GRPO step against TRL's GRPOTrainer on that body, 8 prompts x 8 x 128 tokens, bf16 (goal: <= 0.6x)
#   5. the train step at the 0.5B and 1.5B shapes: tokens/s, fraction of the bf16 matmul peak, peak memory
#      (goal: >= 35% at 1.5B)
#   6. a Qwen2.5-7B-shaped LoRA run (rank 16, 3 steps): time and peak GPU memory
# Model folders are random-init bodies of the published shapes built there (benchmarks/shaped_model.py). Every
# check has its own time limit and the whole script stops starting checks at 470 s, so it ends inside 8 minutes.
# Logs: $OUT/gpu-check.tar.gz (one file: the device tool returns at most 8). Record the numbers in BENCHMARKS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
budget=${GPU_CHECK_BUDGET:-470}
logs=$(mktemp -d /tmp/gpu-check.XXXX)
out=${OUT:-gpu-check}
mkdir -p "$out"
if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then  # the same commands on a CPU at toy sizes: the plumbing, not the numbers
  dev=cpu small=narrow medium=narrow large=narrow tokens=8 precision=float32 dtype=float32 graph=--static steps=2
  small_length=128 medium_length=256 matmul=512
  python=${PYTHON:-/work/venv/bin/python}
else
  dev=cuda small=0.5b medium=1.5b large=7b tokens=128 precision=bf16 dtype=bfloat16 graph=--graph steps=40
  small_length=1024 medium_length=2048 matmul=8192
  python=${PYTHON:-python3}
fi
if ls .whl/*.whl >/dev/null 2>&1 && [ "$dev" = cuda ]; then
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$logs/install.txt" 2>&1 || { echo "install of .whl/ failed:"; tail -5 "$logs/install.txt"; }
  export PYTHONPATH="$PWD/src:/tmp/site"
else
  export PYTHONPATH="$PWD/src"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi 2>&1 || echo "no nvidia-smi"; } > "$logs/nvidia-smi.txt"
$python -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" \
  2>&1 | tee "$logs/versions.txt"

check() {  # name, seconds, a grep -E pattern of the lines to show, command...
  local name=$1 limit=$2 pattern=$3; shift 3
  local left=$((budget - (SECONDS - began)))
  if [ "$left" -lt 15 ]; then echo "$name: skipped (the script's $budget s are spent)" | tee -a "$logs/summary.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS
  timeout "$limit" "$@" > "$logs/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$logs/summary.txt"
  grep -E "$pattern" "$logs/$name.txt" | tail -4 | sed 's/^/    /' | tee -a "$logs/summary.txt"
}

folders=/tmp/gpu-check-models
mkdir -p "$folders"
runs=$(mktemp -d /tmp/gpu-check-runs.XXXX)  # a fresh run dir per call: a second call on a warm machine is no resume
check cuda-tests 90 "passed|failed|error" $python -m pytest -q -p no:cacheprovider tests/engine -k "cuda or gpu"
check default-run 45 "held-out|pass@1|steps in|Error" $python -m whileai train --device "$dev" --steps "$steps" \
  --no-progress --run-dir "$runs/default"
check build-small 40 "written|Error" $python benchmarks/shaped_model.py --shape "$small" --out "$folders/$small" \
  --device "$dev" --dtype "$dtype"
check sampler 110 "prompts x|Error" $python benchmarks/decode.py --shape "$small" --device "$dev" --dtype "$dtype" \
  $graph --batches 1,64 --tokens "$tokens" --repeats 2
check sampler-64x8 70 "prompts x|Error" $python benchmarks/decode.py --shape "$small" --device "$dev" \
  --dtype "$dtype" $graph --batches 64 --samples 8 --tokens "$tokens" --repeats 2
if $python -c "import trl, datasets" > "$logs/trl-import.txt" 2>&1; then
  check grpo-vs-trl 100 "step median|update phase|per step|Error" $python benchmarks/vs_trl.py --device "$dev" \
    --precision "$precision" --model "$folders/$small" --prompts 8 --k 8 --tokens "$tokens" --steps 3 --matmul-seconds 0.2
else
  echo "grpo-vs-trl: skipped: trl/datasets do not import ($(tail -1 "$logs/trl-import.txt")); carry them (scripts/gpu_wheels.sh, --with-pyarrow for an old pyarrow)" | tee -a "$logs/summary.txt"
fi
check train-step-small 45 "tokens/s|fraction|memory|Error" $python benchmarks/train_step.py --device "$dev" \
  --precision "$precision" --model "$folders/$small" --batch 8 --length "$small_length" --rounds 3 --matmul-size "$matmul" \
  --matmul-seconds 0.3
check build-medium 40 "written|Error" $python benchmarks/shaped_model.py --shape "$medium" --out "$folders/$medium" \
  --device "$dev" --dtype "$dtype"
check train-step-medium 60 "tokens/s|fraction|memory|Error" $python benchmarks/train_step.py --device "$dev" \
  --precision "$precision" --model "$folders/$medium" --batch 8 --length "$medium_length" --rounds 3 --matmul-size "$matmul" \
  --matmul-seconds 0.3
rm -rf "${folders:?}/$medium"
check build-large 45 "written|Error" $python benchmarks/shaped_model.py --shape "$large" --out "$folders/$large" \
  --device "$dev" --dtype "$dtype"
check lora-large 70 "lora run|Error" $python -c "
import runpy, sys, time
sys.path.insert(0, 'benchmarks')
import peak_memory
sys.argv = ['whileai', 'train', '--device', '$dev', '--model', '$folders/$large', '--lora-rank', '16', '--steps', '3',
            '--eval-tasks', '16', '--no-progress', '--run-dir', '$runs/lora']
start, code = time.perf_counter(), 0
try:
    runpy.run_module('whileai', run_name='__main__', alter_sys=True)
except SystemExit as stop:
    code = stop.code
print(f'lora run: exit {code} in {time.perf_counter() - start:.0f} s, {peak_memory.describe(\"$dev\")}')
"
echo "gpu_check: done in $((SECONDS - began)) s" | tee -a "$logs/summary.txt"
tar -czf "$out/gpu-check.tar.gz" -C "$logs" . && echo "logs: $out/gpu-check.tar.gz"
