"""The positive control: REINFORCE with a running-mean baseline against the same update without one.

Run: python recipes/controls/baseline.py [--seeds N] [--taskset T] [--model PATH] [--device cuda]
(the same as `wai recipe baseline ...`; every flag: --help). The arms are in src/whileai/evidence/controls.py;
recipes/controls/README.md says what each control must read.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("baseline"))
