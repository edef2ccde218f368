"""Toy worlds the update rules are proven on (``whileai.simulations.toy``, numpy only), and the slow
per-token references every method is checked against (``whileai.simulations.reference``, plain Python)."""

from whileai.simulations.toy import ToyWorld, TrainResult, policy_gradient, sample_rows, train

__all__ = ["ToyWorld", "TrainResult", "policy_gradient", "sample_rows", "train"]
