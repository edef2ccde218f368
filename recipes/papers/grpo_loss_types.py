"""GRPO's loss types: grpo (1/(B T_i)) against bnpo (1/N) and dr_grpo (1/(B max_tokens), max_tokens the
run's generation cap).

Run: python recipes/papers/grpo_loss_types.py [--seeds N] [--lag L] [--steps S] [--model PATH] [--device cuda]
(the same as `wai recipe grpo_loss_types ...`; every flag: --help). The arms are in src/whileai/evidence/papers.py;
recipes/papers/README.md names the knobs that reach the paper's regime.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("grpo_loss_types"))
