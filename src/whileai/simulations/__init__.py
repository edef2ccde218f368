"""Toy worlds the update rules are proven on (see ``whileai.simulations.toy``). numpy only."""

from whileai.simulations.toy import ToyWorld, TrainResult, policy_gradient, sample_rows, train

__all__ = ["ToyWorld", "TrainResult", "policy_gradient", "sample_rows", "train"]
