"""The null control: two identical arms (FlashReinforce) whose runs differ only in their seed.

Run: python recipes/controls/null.py [--repeats R] [--seeds N] [--taskset T] [--model PATH] [--device cuda]
(the same as `wai recipe null ...`; every flag: --help). The arms are in src/whileai/evidence/controls.py;
recipes/controls/README.md says what each control must read.
"""

import sys

from whileai.cli.recipe_cmd import script_main

if __name__ == "__main__":
    sys.exit(script_main("null"))
