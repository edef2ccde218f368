"""BPCO's bounded critic and DPPO clip: BPCO against the standard PPO critic recipe (as SAO with a [0.8, 1.2] band).

Run: python recipes/papers/bpco.py [--seeds N] [--lag L] [--steps S] [--model PATH] [--device cuda]
(the same as `wai recipe bpco ...`; every flag: --help). The arms are in src/whileai/evidence/papers.py;
recipes/papers/README.md names the knobs that reach the paper's regime.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("bpco"))
