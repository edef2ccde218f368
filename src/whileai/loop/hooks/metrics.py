"""What a run writes as it goes: ``metrics.jsonl``, TensorBoard event files, the curves PNG, a progress bar."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.loop.types import Hook, Loop

if TYPE_CHECKING:  # the context holds the metrics, so the hook names it as a type only
    from tensorboardX import SummaryWriter
    from tqdm.auto import tqdm

    from whileai.loop.hooks.context import Context
    from whileai.loop.step import StepResult

# What the progress bar shows, and under which short name.
LIVE = (("reward", "reward"), ("pass_rate", "pass"), ("drift", "drift"), ("admitted_share", "admit"),
        ("staleness/max", "stale"))


class Metrics:
    """Append-only ``metrics.jsonl`` plus TensorBoard scalars; on resume, lines past the checkpoint are cut."""

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", -1) <= resume_step]
            _atomic_write(self.path, "".join(line + "\n" for line in kept))
        elif self.path.exists():
            self.path.unlink()
        self.board_dir, self.purge_step = run_dir / "tensorboard", None if resume_step is None else resume_step + 1
        self._board: SummaryWriter | None = None

    @property
    def board(self) -> SummaryWriter:
        """The TensorBoard writer, made at the first scalar: a tensorboard/ folder holds a run's numbers (a run
        stopped before any is written leaves none, and ``whileai.loop.run`` reads its presence as work done)."""
        if self._board is None:
            from tensorboardX import SummaryWriter

            self._board = SummaryWriter(str(self.board_dir), purge_step=self.purge_step)
        return self._board

    def write(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(dict(record)) + "\n")
        step = int(record.get("step", 0))
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.board.add_scalar(key, float(value), step)
        self.board.flush()

    def scalar(self, key: str, value: float, step: int) -> None:
        """One TensorBoard scalar outside a step's record (the held-out pass@1 before and after training)."""
        self.board.add_scalar(key, float(value), step)
        self.board.flush()

    def read(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()] \
            if self.path.exists() else []

    def close(self) -> None:
        if self._board is not None:
            self._board.close()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: object) -> None:
    _atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")


class Progress:
    """A tqdm bar with ETA and the live numbers; silent when ``enabled`` is False. The bar is drawn at its first
    step, so the lines printed before it (the run plan, the warm start's header) are not split by an empty bar."""

    def __init__(self, total: int, initial: int, enabled: bool, description: str) -> None:
        self.bar: tqdm | None = None
        self.enabled = enabled
        self.description = description
        self._start = (description, total, initial)

    def _drawn(self) -> tqdm | None:
        if self.bar is None and self.enabled:
            from tqdm.auto import tqdm

            description, total, initial = self._start
            self.bar = tqdm(total=total, initial=initial, desc=description, unit="step", dynamic_ncols=True)
        return self.bar

    def update(self, record: Mapping[str, Any]) -> None:
        bar = self._drawn()
        if bar is None:
            return
        bar.set_postfix({short: f"{record[key]:.3g}" for key, short in LIVE if key in record}, refresh=False)
        bar.update(1)

    def phase(self, description: str | None, total: int, initial: int) -> None:
        """The bar counts another phase: the warm start's steps (``description`` 'warm start'), then RL's
        (None: the method's name again)."""
        if not self.enabled:
            return
        if self.bar is None:
            self._start = (description or self.description, total, initial)
            return
        self.bar.set_description(description or self.description, refresh=False)
        self.bar.reset(total=total)
        self.bar.update(initial)

    def warm(self, record: Mapping[str, Any], total: int, every: int) -> None:
        """One warm-start step: on the bar (loss, pass estimate); with the bar off, a line at its first step,
        every ``every`` steps and at the last."""
        step = int(record["warm_start_step"])
        bar = self._drawn()
        if bar is not None:
            bar.set_postfix({"loss": f"{record['loss']:.3f}", "est": f"{record['pass_estimate']:.3f}"},
                            refresh=False)
            bar.update(1)
        elif step == 1 or step % every == 0 or step == total:
            print(f"warm start step {step}/{total}: loss {record['loss']:.3f}, pass estimate "
                  f"{record['pass_estimate']:.2f}", flush=True)

    def write(self, text: str) -> None:
        """A line above the bar (printed plainly while there is no bar)."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plot(records: Iterable[Mapping[str, Any]], evals: Iterable[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Four panels: training reward (and pass rate), held-out pass@1 with its interval, drift, admitted share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records, evals = list(records), list(evals)
    steps = [r["step"] for r in records]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    ax = axes[0][0]
    ax.plot(steps, [r.get("reward", float("nan")) for r in records], label="mean reward")
    ax.plot(steps, [r.get("pass_rate", float("nan")) for r in records], label="pass rate", alpha=0.7)
    ax.set_title("training rollouts")
    ax.legend()
    ax = axes[0][1]
    if evals:
        x = [e["step"] for e in evals]
        y = [e["pass_at_1"] for e in evals]
        low = [e["pass_at_1"] - e["ci95"][0] for e in evals]
        high = [e["ci95"][1] - e["pass_at_1"] for e in evals]
        ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=4)
    ax.set_title("held-out pass@1 (95% interval)")
    ax.set_ylim(0, 1)
    drift = "drift: KL per token, sampler vs policy\n(the method's mean sequence KL, else k3)"
    for ax, key, name in ((axes[1][0], "drift", drift), (axes[1][1], "admitted_share", "admitted share")):
        ax.plot(steps, [r.get(key, float("nan")) for r in records])
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


@dataclass
class Record(Hook):
    """metrics.jsonl, TensorBoard, the progress bar, and the method's notes every tenth step."""

    ctx: Context

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        self.ctx.metrics.write(record)
        self.ctx.log.update(record)
        for note in result.update.notes[:2] if record["step"] % 10 == 0 else ():
            self.ctx.log.write(f"step {record['step']} note: {note}")
