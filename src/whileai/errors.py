"""The exceptions whileai raises for anything a user can trigger.

Every message names the row or field, the value, why it is wrong and how to fix it.
"""

from __future__ import annotations


class WhileaiError(Exception):
    """Base class of every whileai error."""


class BatchError(WhileaiError, ValueError):
    """A row or batch that breaks the batch contract (see DESIGN.md, "A row")."""


class ConfigError(WhileaiError, ValueError):
    """A method, engine or writer setting outside its valid range."""
