"""Per-algorithm ``build_loss`` functions that run against any provider: the engine in-process, or
``wai serve`` through its client. Spec: 004 "More algorithms"; docs/algorithms.md.

    (their loops, rl_loop / teacher_loop, are gone: `wai train [--url U]` runs every method, whileai.loop)

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
from whileai.algorithms.registry import ALGORITHMS, Algorithm, algorithm, algorithm_names

__all__ = ["ALGORITHMS", "Algorithm", "Completion", "ForwardRequest", "Group", "LossContext", "NoOptions", "Options",
           "Sample", "SampleRequest", "Teacher", "algorithm", "algorithm_names", "clip_fields",
           "group_mean_advantages", "leave_one_out_baseline", "require_advertised_loss", "rl_datum"]
