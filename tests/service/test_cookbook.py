"""tinker-cookbook as a test suite: its own supervised and RL ``train.main``, unmodified, against `wai serve`.

The cookbook pins its own transformers, so it runs from a venv of its own (``scripts/cookbook_venv.sh``: built
once from the package registry, cached under ~/.cache/whileai-cookbook-venv) through
``scripts/cookbook_run.py``; `wai serve` runs here on models exported from ``builtin:tiny`` (three seeds, three
folders). Checked: both loops complete; the supervised run, started again on its log folder as if it had been
killed after its last periodic checkpoint, resumes there (the cookbook's own resume: the renderer read back with
``RestClient.get_training_run_by_tinker_path``, then ``create_training_client_from_state_with_optimizer``); the
supervised NLL falls (train and held-out); the RL reward (the share of lowercase letters a ``ProblemEnv`` of ours
pays) rises on every seed; the cookbook's sampler-vs-trainer KL ``optim/kl_sample_train_v1`` is ~0 at every step
(sampling and training see the same weights).
``scripts/cookbook_check.sh`` runs this file. About 4-5 minutes on two shared CPU cores.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from whileai.service.launch import start_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SEEDS = (0, 1, 2)
SFT_STEPS, RL_STEPS = 12, 12


@pytest.fixture(scope="module")
def cookbook_python() -> str:
    built = subprocess.run(["bash", str(ROOT / "scripts" / "cookbook_venv.sh")], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"tinker-cookbook could not be installed from the registry: {built.stderr.strip()[-600:]}")
    return built.stdout.strip().splitlines()[-1]


def run(python: str, server: Any, mode: str, model: Path, log: Path, **options: Any) -> tuple[list[dict[str, Any]], str]:
    """The cookbook's metrics (every step of ``log``'s metrics.jsonl) and its log output."""
    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": server.token, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the cookbook's venv, not ours
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    done = subprocess.run([python, str(ROOT / "scripts" / "cookbook_run.py"), mode, "--model", str(model),
                           "--log-path", str(log), *flags], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, f"{mode} failed:\n{done.stderr[-3000:]}\nserver:\n{server.log_tail()}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def interrupt(checkpoints: Path) -> int:
    """Make a finished cookbook run look killed after its last periodic checkpoint (drop the "final" record of
    its checkpoints.jsonl); the batch that checkpoint resumes at."""
    records = [json.loads(line) for line in checkpoints.read_text().splitlines()]
    kept = [r for r in records if r["name"] != "final"]
    assert kept and len(kept) < len(records), records
    checkpoints.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return int(kept[-1]["batch"])


def models(tmp: Path) -> list[Path]:
    from whileai.engine import TrainingEngine

    return [Path(TrainingEngine("builtin:tiny", seed=s).export(str(tmp / f"tiny-seed{s}"), merged=True))
            for s in SEEDS]


def test_cookbook_supervised_and_rl_train_main_run_unmodified(cookbook_python: str, tmp_path: Path) -> None:
    started = time.monotonic()
    folders = models(tmp_path)
    args = [a for f in folders for a in ("--model", str(f))]
    with start_server(tmp_path / "data", token="tml-" + secrets.token_urlsafe(16), args=args) as server:
        run(cookbook_python, server, "sft", folders[0], tmp_path / "sft", steps=SFT_STEPS)
        resumed_at = interrupt(tmp_path / "sft" / "run" / "checkpoints.jsonl")
        sft, resumed = run(cookbook_python, server, "sft", folders[0], tmp_path / "sft", steps=SFT_STEPS)
        rl = {s: run(cookbook_python, server, "rl", folder, tmp_path / f"rl{s}", steps=RL_STEPS, seed=s)[0]
              for s, folder in zip(SEEDS, folders)}
    # the second run resumed the first: its state with the optimizer, its run's renderer read back by RestClient
    assert "Resumed training from tinker://" in resumed
    assert "Renderer metadata matches for checkpoint" in resumed and "Could not fetch renderer" not in resumed
    lines = [m for m in sft if "train_mean_nll" in m]
    first, second = lines[:SFT_STEPS], lines[SFT_STEPS:]   # the cookbook appends the resumed run's lines
    train_nll = [m["train_mean_nll"] for m in first]
    test_nll = [m["test/nll"] for m in sft if "test/nll" in m]
    print(f"sft: train NLL {train_nll[0]:.3f} -> {train_nll[-1]:.3f}, held-out {test_nll[0]:.3f} -> {test_nll[-1]:.3f}; "
          f"resumed at batch {resumed_at}: {second[0]['train_mean_nll']:.3f} -> {second[-1]['train_mean_nll']:.3f}")
    assert [m["step"] for m in first] == list(range(1, SFT_STEPS + 1)) and len(second) == SFT_STEPS - resumed_at
    assert train_nll[-1] < 0.6 * train_nll[0]
    assert test_nll[-1] < test_nll[0] - 0.5
    # the resumed run went on from the checkpoint's weights (which, as the cookbook pipelines its submits, hold
    # two optimizer steps more than the batch it names), not from the base model
    assert second[0]["train_mean_nll"] < train_nll[resumed_at - 1] and second[-1]["train_mean_nll"] < train_nll[-1]
    for seed, metrics in rl.items():
        reward = [m["env/all/reward/total"] for m in metrics if "env/all/reward/total" in m]
        kl = [m["optim/kl_sample_train_v1"] for m in metrics if "optim/kl_sample_train_v1" in m]
        print(f"rl seed {seed}: reward {' '.join(f'{r:.2f}' for r in reward)}; max |kl_sample_train_v1| "
              f"{max(map(abs, kl)):.1e}")
        assert len(reward) == len(kl) == RL_STEPS
        assert sum(reward[-3:]) / 3 > sum(reward[:3]) / 3 + 0.1, (seed, reward)
        assert max(map(abs, kl)) < 1e-3, (seed, kl)  # on-policy: the trainer scores what the sampler drew
    print(f"cookbook check: {time.monotonic() - started:.0f} s")
