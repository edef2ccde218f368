"""``python -m whileai.engine``: the built-in models and their parameter counts."""

from whileai.engine.models import builtin_table

print(builtin_table())
