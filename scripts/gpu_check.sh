#!/usr/bin/env bash
# The engine's and the loop's checks that need a CUDA GPU, as one script for a lent GPU machine.
#
#   bash scripts/gpu_check.sh            # logs under ${OUT:-gpu-check}/, one summary line per check on stdout
#
# It installs the package into a virtual environment that sees the machine's CUDA torch (it never replaces an
# installed torch), then runs, each under its own time limit so that one hang cannot eat the lease (worst
# case 460 s of checks in all, plus the install, which has not been timed on a GPU machine):
#   1. the CUDA tests (tests/engine -k cuda)
#   2. benchmarks/train_step.py on cuda in float32 and in bf16 (float32 weights under bfloat16 autocast)
#   3. benchmarks/logprob_memory.py on cuda
#   4. a short `wai train --device cuda` on builtin:small (the loop end to end on the GPU)
#   5. one paper recipe at a small size on cuda (`wai recipe flash_reinforce`, 2 seeds)
# Record what it prints in BENCHMARKS.md and docs/evidence.md, with the GPU's name.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
python3 -m venv --system-site-packages .venv-gpu
. .venv-gpu/bin/activate
python -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'; print(torch.__version__, torch.cuda.get_device_name(0))" \
  > "$out/torch.txt" 2>&1 || { cat "$out/torch.txt"; exit 1; }
echo "gpu: $(cat "$out/torch.txt")"
pip install -q --no-deps -e . && pip install -q tqdm tensorboardX matplotlib pytest fastapi uvicorn httpx >/dev/null 2>&1
check() {  # name, seconds, the log line to show (a grep pattern), command...
  local name=$1 limit=$2 pattern=$3; shift 3
  local began=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  local line
  line=$(grep -E "$pattern" "$out/$name.txt" | tail -1)
  echo "$name: exit $rc in $((SECONDS - began)) s${line:+ | $line}" | tee -a "$out/summary.txt"
}
check cuda-tests 150 "passed|failed|error" python -m pytest -q tests/engine -k cuda -p no:cacheprovider
check train-step-fp32 50 "fraction of matmul peak|tokens/s" python benchmarks/train_step.py --device cuda \
  --precision float32
check train-step-bf16 50 "fraction of matmul peak|tokens/s" python benchmarks/train_step.py --device cuda \
  --precision bf16
check logprob-memory 50 "peak|ratio" python benchmarks/logprob_memory.py --device cuda
rm -rf /tmp/wai-gpu-run /tmp/wai-gpu-recipe
check wai-train 80 "held-out pass@1" wai train --device cuda --model builtin:small --steps 20 --eval-tasks 32 \
  --no-progress --run-dir /tmp/wai-gpu-run
cp /tmp/wai-gpu-run/summary.json "$out/wai-train-summary.json" 2>/dev/null || true
check recipe 80 "^flash_reinforce " wai recipe flash_reinforce --seeds 2 --steps 10 --eval-tasks 32 --device cuda \
  --model builtin:small --run-dir /tmp/wai-gpu-recipe
