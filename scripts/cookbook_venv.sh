#!/usr/bin/env bash
# Build (once) the separate venv tinker-cookbook runs in; print its python. The cookbook pins transformers
# (0.5.x: <=5.5.4) and so cannot share whileai's venv. Cached under ~/.cache, keyed by the versions.
# COOKBOOK_VERSIONS is tried in order: 0.6.1 needs tml-renderers>=0.4.1, which this machine's registry does
# not have (it has 0.0.1-0.2.1), so here 0.5.8 (the newest whose dependencies resolve) is what installs.
set -euo pipefail
COOKBOOK_VERSIONS="${COOKBOOK_VERSIONS:-0.6.1 0.5.8}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
ROOT="${COOKBOOK_VENV_ROOT:-$HOME/.cache/whileai-cookbook-venv}"
for version in $COOKBOOK_VERSIONS; do
  venv="$ROOT/cookbook-${version}-torch-${TORCH_VERSION}"
  if [ -f "$venv/.complete" ]; then echo "$venv/bin/python"; exit 0; fi
  if [ -f "$venv/.failed" ]; then continue; fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  # torch first, at the version pip has on disk (a CPU wheel); otherwise the cookbook's deps pull a CUDA build
  "$venv/bin/pip" install -q "torch==${TORCH_VERSION}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  if "$venv/bin/pip" install -q "tinker-cookbook==${version}" 2> "$venv/install.log"; then
    touch "$venv/.complete"; echo "$venv/bin/python"; exit 0
  fi
  echo "tinker-cookbook==${version} does not install here: $(grep '^ERROR' "$venv/install.log" | tail -2)" >&2
  touch "$venv/.failed"
done
echo "no tinker-cookbook version of [$COOKBOOK_VERSIONS] installs here" >&2; exit 1
