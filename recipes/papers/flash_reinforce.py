"""FlashREINFORCE's trust gate: FlashReinforce against the same estimator with the gate never closing.

Run: python recipes/papers/flash_reinforce.py [--seeds N] [--lag L] [--steps S] [--model PATH] [--device cuda]
(the same as `wai recipe flash_reinforce ...`; every flag: --help). The arms are in src/whileai/evidence/papers.py;
recipes/papers/README.md names the knobs that reach the paper's regime.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("flash_reinforce"))
