"""The lag table: each method's held-out pass@1 at sampler lags 0, 2, 4, 8, 16 and its share of lag 0.

Run: python recipes/papers/lag_table.py [--methods ...] [--lags 0,2,4,8,16] [--seeds N] [--model PATH] [--device cuda]
(the same as `wai lags ...`; every flag: --help). The rows are in src/whileai/evidence/lags.py; the measured table
is in docs/evidence.md.
"""

import sys

from whileai.cli import main

if __name__ == "__main__":
    sys.exit(main(["lags", *sys.argv[1:]]))
