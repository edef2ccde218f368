"""Regenerate the defaults tables in docs/methods.md from the one defaults table.

    python docs/gen_methods_tables.py        # rewrites docs/methods.md in place

tests/methods/test_docs.py fails when the file and DEFAULTS disagree.
"""

from pathlib import Path

from whileai.cli.methods_cmd import render_tables

DOC = Path(__file__).with_name("methods.md")

if __name__ == "__main__":
    DOC.write_text(render_tables(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"rewrote the defaults tables in {DOC}")
