#!/usr/bin/env bash
# tinker-cookbook's supervised and RL train.main, unmodified, against a `wai serve` subprocess
# (tests/service/test_cookbook.py). Builds the cookbook's own venv once (scripts/cookbook_venv.sh; ~11 min on
# two shared cores the first time), then takes about 4-5 minutes. Run from the repository root with whileai's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec python -m pytest tests/service/test_cookbook.py -m slow -q -s -p no:cacheprovider "$@"
