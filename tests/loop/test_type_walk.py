"""The type checker follows ``learning_rate`` and ``temperature`` from where a run takes them to the engine,
with no ``Any`` on the way (issue 32; the chain is written out in docs/decisions.md, "Types on the main path").

mypy checks ``WALK`` with ``--disallow-any-expr`` (an error at every expression whose type is ``Any``), so a hop
that loses the type fails here, and ``reveal_type`` pins what each hop is. ``WALK`` re-enacts the hops the loop
makes (``make_plan``'s resolution, ``core._step``'s Adam settings, the rollouts' ``SamplingParams``, the
scoring ``Distribution``), each with the library's own functions and types.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import whileai

mypy_api = pytest.importorskip("mypy.api")

SRC = Path(whileai.__file__).resolve().parents[1]
ROOT = SRC.parent

WALK = '''
import dataclasses

from whileai.engine.logprobs import scoring
from whileai.engine.training import AdamParams, TrainingEngine, as_params
from whileai.envs.core import Taskset
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import Resolved, RunPlan, _Resolving, learning_rate_rule, make_plan
from whileai.trainers import Trainer
from whileai.loop.types import Adam
from whileai.methods.base import Sampled


def learning_rate(config: TrainConfig, method: Sampled, taskset: Taskset, trainer: Trainer,
                  engine: TrainingEngine) -> None:
    reveal_type(config.learning_rate)  # --learning-rate is this field's flag (cli/train_cmd: one per field)
    reveal_type(learning_rate_rule(config, method, taskset, Resolved(warm_start_steps=0)))  # no flag: the rule
    resolved = _Resolving(config, {}, method, taskset).rule("learning_rate", config.learning_rate,
                                                           learning_rate_rule)
    reveal_type(resolved)
    plan = make_plan(config, {}, method, taskset)
    reveal_type(plan.learning_rate)
    rate = plan.learning_rate_at(0)  # core._step: each step's rate under the schedule
    reveal_type(rate)
    adam: Adam = {"learning_rate": rate}
    reveal_type(trainer.optim_step(adam))
    reveal_type(engine.optim_step(adam))
    reveal_type(as_params(AdamParams, adam, "adam_params").learning_rate)  # what AdamW's lr is set to


def temperature(method: Sampled, plan: RunPlan, trainer: Trainer, engine: TrainingEngine) -> None:
    reveal_type(method.temperature)  # wai.GRPO(temperature=...): the method's field, declared once
    reveal_type(method.run_spec().temperature)
    reveal_type(plan.temperature)
    params = plan.sampling()  # what the rollouts sample with and the trainer scores under
    reveal_type(params.temperature)
    turn = dataclasses.replace(params, max_tokens=8, stop=("\\n",), seed=0)  # rollouts: each turn's
    reveal_type(turn.temperature)
    reveal_type(trainer.sample([[1, 2]], 1, turn))
    reveal_type(engine.sample([[1, 2]], 1, turn))
    reveal_type(scoring(params).temperature)  # the distribution a token is scored under
'''

# what each reveal_type in WALK shows, in order
EXPECTED = ["float | None", "tuple[float, str]", "float", "float", "float", "whileai.trainers.base.OptimOutput",
            "whileai.engine.training.OptimStepOutput", "float",
            "float", "float", "float", "float", "float", "list[Any]", "list[Any]", "float"]
SAMPLED = "list[Any]"
"""what ``sample`` returns: the trainer's own sequences (off the walk; the settings going in are typed)"""


@pytest.mark.slow
def test_learning_rate_and_temperature_reach_the_engine_typed(tmp_path: Path) -> None:
    walk = tmp_path / "walk.py"
    walk.write_text(WALK)
    os.environ["MYPYPATH"] = str(SRC)
    out, err, status = mypy_api.run([str(walk), "--config-file", str(ROOT / "pyproject.toml"),
                                     "--disallow-any-expr", "--follow-imports=silent", "--no-incremental",
                                     "--cache-dir", os.devnull])
    revealed = re.findall(r'walk\.py:\d+: note: Revealed type is "(.*)"', out)
    assert revealed == EXPECTED, out
    lines = WALK.splitlines()
    errors = re.findall(r"walk\.py:(\d+): error: (.*)", out)
    off_walk = [(n, e) for n, e in errors if ".sample(" in lines[int(n) - 1] and f'(has type "{SAMPLED}")' in e]
    assert errors == off_walk and len(off_walk) == 2, out  # no other expression on the walk is Any
