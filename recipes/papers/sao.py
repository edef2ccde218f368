"""SAO's ratio band: SAO against the same critic with the ratio never masked.

Run: python recipes/papers/sao.py [--seeds N] [--lag L] [--steps S] [--model PATH] [--device cuda]
(the same as `wai recipe sao ...`; every flag: --help). The arms are in src/whileai/evidence/papers.py;
recipes/papers/README.md names the knobs that reach the paper's regime.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("sao"))
