"""The build_loss-era loops, kept importable until ``wai train --url`` replaces them: ``rl_loop`` and
``teacher_loop`` run any method of ``whileai.methods`` (the one registry) against an engine or ``wai serve``.
"""

from whileai.algorithms.loops import LoopResult, rl_loop, teacher_loop

__all__ = ["LoopResult", "rl_loop", "teacher_loop"]
