#!/usr/bin/env bash
# Download, on a machine with a package index, the wheels scripts/gpu_check.sh installs on a GPU machine that has none.
#
#   bash scripts/gpu_wheels.sh                 # into .whl/ (git-ignored): ~8 MB
#   bash scripts/gpu_wheels.sh --with-pyarrow  # also pyarrow 26 (+42 MB) for a GPU image whose pyarrow is older
#
# The GPU machine (reference/gpu.md) has Python 3.12, torch, transformers, peft, accelerate, numpy, httpx, anyio,
# click, h11, pytest, protobuf, pyarrow, pandas, xxhash, tqdm; it lacks what whileai's server, metrics and config
# need (fastapi, starlette, pydantic, pydantic-core, annotated-types, annotated-doc, typing-inspection, uvicorn,
# tensorboardX, tomli-w, opentelemetry-api) and what the TRL comparison needs (trl, datasets, dill, multiprocess).
# The versions are the ones whileai's tests pass with here. Each wheel is fetched without its dependencies
# (--no-deps), for CPython 3.12 on manylinux x86-64, as the device tool's README says.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-/work/venv/bin/pip}
[ -x "$PIP" ] || PIP="python3 -m pip"
out=.whl
mkdir -p "$out"
wheels=(
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  annotated-doc==0.0.7 typing-inspection==0.4.5 typing-extensions==4.16.0 uvicorn==0.55.0 tensorboardX==2.6.5
  tomli-w==1.2.0 opentelemetry-api==1.45.3
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
if [ "${1:-}" = "--with-pyarrow" ]; then
  wheels+=(pyarrow==26.0.1)
fi
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$out" "${wheels[@]}"
ls "$out"
du -sh "$out"
