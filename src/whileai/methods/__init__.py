"""Every method as a validated config whose ``update(batch)`` returns per-token coefficients.

numpy only: importing this never imports torch. See ``docs/methods.md``.
"""

from whileai.methods.base import Method, Update
from whileai.methods.registry import method, method_names

__all__ = ["Method", "Update", "method", "method_names"]


def __getattr__(name: str):  # noqa: ANN202 - lazy access to classes such as ReinforceAda
    import whileai

    return getattr(whileai, name)
