"""Per-algorithm ``build_loss`` functions that run against any provider: the engine in-process, or
``wai serve`` through its client. Spec: 004 "More algorithms"; docs/algorithms.md.

    from whileai.algorithms import rl_loop, teacher_loop
    result = rl_loop(None, "grpo_nostd", "builtin:case", cycles=3)           # an in-process engine
    result = teacher_loop(client, "opd", "builtin:case", teacher_seed=1)      # a wai serve Client

Each algorithm is one short module with ``build_loss(sample, cycle, request, ctx) -> ForwardRequest``;
``method:NAME`` runs any method of the methods library through ``cross_entropy`` with ``weights = c``.
"""

from whileai.algorithms.core import (
    Completion,
    ForwardRequest,
    Group,
    LossContext,
    NoOptions,
    Options,
    Sample,
    SampleRequest,
    Teacher,
    clip_fields,
    group_mean_advantages,
    leave_one_out_baseline,
    require_advertised_loss,
    rl_datum,
)
from whileai.algorithms.loops import LoopResult, rl_loop, teacher_loop
from whileai.algorithms.registry import ALGORITHMS, Algorithm, algorithm, algorithm_names

__all__ = ["ALGORITHMS", "Algorithm", "Completion", "ForwardRequest", "Group", "LoopResult", "LossContext", "NoOptions", "Options",
           "Sample", "SampleRequest", "Teacher", "algorithm", "algorithm_names", "clip_fields",
           "group_mean_advantages", "leave_one_out_baseline", "require_advertised_loss", "rl_datum", "rl_loop",
           "teacher_loop"]
