"""Running many ``wai.train`` calls as one piece of evidence: check them all first, then train, resume or read back.

A recipe or a lag table is dozens of runs. ``precheck`` runs the loop's own checks on every run's settings
before the first one trains, so a sweep cannot fail an hour in on a setting it could have refused at once.
``train_or_read`` makes the folder of runs the sweep's memory: a run that finished with the same settings is
read back, one that was stopped (Ctrl-C writes a checkpoint) is resumed, and a folder holding a different run is
an error that names it; nothing is overwritten. So the same command, run again, continues where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError
from whileai.loop import train
from whileai.methods.registry import method as build_method

# the fields a run's saved config must share with the wanted one to be read back or resumed
SAME = ("method", "knobs", "seed", "lag", "steps", "rollouts_per_step", "learning_rate", "critic_learning_rate",
        "model", "taskset", "taskset_options", "max_tokens", "eval_tasks", "eval_samples", "warm_start_steps",
        "warm_start_learning_rate", "lora_rank", "device")
_NOT_CONFIG = ("progress", "run_dir")


def precheck(plans: Sequence[Mapping[str, Any]], label: Any = None) -> None:
    """The loop's checks of every run's settings (its method and knobs, the lag bound, the steps a critic's
    warm-up leaves), each distinct problem once with the runs it concerns, before anything trains.
    ``label(settings)`` names a run in the listing (default: its method and knobs)."""
    from whileai.loop.plan import config as config_io
    from whileai.loop.plan.checks import _load_taskset, check, resolve_method

    found: dict[str, list[str]] = {}
    for settings in plans:
        name = label(settings) if label else f"{settings['method']} {json.dumps(settings.get('knobs', {}))}"
        try:
            build_method(settings["method"], **settings.get("knobs", {}))
        except ConfigError as e:
            found.setdefault(str(e), []).append(name)
            continue
        config = config_io.build(None, **{k: v for k, v in settings.items() if k not in _NOT_CONFIG})
        method, problems = resolve_method(config)
        taskset, more = _load_taskset(config)
        for problem in problems + more + (check(config, method, taskset) if taskset is not None else []):
            found.setdefault(problem, []).append(name)
    if found:
        lines = [f"{', '.join(dict.fromkeys(names))}: {problem}" for problem, names in found.items()]
        raise ConfigError(config_io._listing(lines))


def check_folder(base: Path) -> Path:
    """``base`` when it is a folder or does not exist yet; a ConfigError when it is a file."""
    if base.exists() and not base.is_dir():
        raise ConfigError(f"run_dir {str(base)!r} is a file, not a folder; give a folder, or a path that does not "
                          "exist yet")
    return base


def train_or_read(settings: Mapping[str, Any]) -> tuple[Any, bool]:
    """``(run, trained)``: the run in ``settings['run_dir']`` when it finished with these settings, resumed from
    its checkpoint when it stopped part way, trained when the folder does not exist. A folder that holds a run
    with other settings, or a stopped run without a checkpoint, is a ConfigError naming it (never overwritten)."""
    from whileai.loop.run import Run

    run_dir = Path(settings["run_dir"])
    check_folder(run_dir)
    if not (run_dir / "config.toml").is_file():
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir} exists and holds no run (no config.toml); give another run_dir or empty "
                              "that folder")
        return train(**settings), True
    _same_settings(run_dir, settings)
    if (run_dir / "summary.json").is_file() and (run_dir / "heldout.jsonl").is_file():
        from whileai.loop.plan import config as config_io

        saved = config_io.build(str(run_dir / "config.toml"))
        return Run(run_dir, saved, json.loads((run_dir / "summary.json").read_text())), False
    if not (run_dir / "checkpoint" / "LATEST").is_file():
        raise ConfigError(f"{run_dir} holds a run that stopped before its first checkpoint, so it cannot be "
                          "resumed; remove that folder and run the same command again")
    return train(resume=str(run_dir), progress=bool(settings.get("progress", False))), True


def _same_settings(run_dir: Path, settings: Mapping[str, Any]) -> None:
    from whileai.loop.plan import config as config_io

    saved = config_io.build(str(run_dir / "config.toml"))
    wanted = config_io.build(None, **{k: v for k, v in settings.items() if k not in _NOT_CONFIG})
    differ = {k: (getattr(saved, k), getattr(wanted, k)) for k in SAME if getattr(saved, k) != getattr(wanted, k)}
    if differ:
        raise ConfigError(f"{run_dir} holds a run with other settings (saved, wanted): {differ}; give another "
                          "run_dir, or remove that folder to train it again")
