"""Graded rows: the batch contract, loading, pass rates, checks, selection and routing.

numpy only: importing this never imports torch.
"""

from whileai.rows.batch import Batch, as_batch

__all__ = ["Batch", "as_batch"]
