"""`wai train` with the warm start stopping where `whileai.loop.rules.warm_start_reached` says, as the run plan
will wire it: every other setting comes from the flags given (docs/tasksets.md, "Your own taskset"). Until the
loop calls the rule itself, this script swaps in a warm start that does, and writes the steps it took to
RUN_DIR/warm_start_steps.txt.

    python examples/tasksets/measure.py --taskset examples/tasksets/parity.jsonl --warm-start-steps 2000 \\
        --learning-rate 1e-3 --max-tokens 3 --run-dir runs/parity-rules
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from whileai.cli import main
from whileai.engine.datums import make_datum
from whileai.envs.episode import reference_episode
from whileai.loop import rules
from whileai.loop.rollouts import step_tasks
from whileai.loop.run import _Trainer


def warm_start_until_reached(self: Any) -> list[float]:
    """_Trainer._warm_start, stopping once rules.warm_start_reached holds (at most resolved.warm_start_steps)."""
    losses: list[float] = []
    tokens: list[float] = []
    tasks_all = self.taskset.split("train")
    for k in range(self.resolved.warm_start_steps):
        tasks = step_tasks(tasks_all, min(self.config.warm_start_batch, len(tasks_all)), self.config.seed,
                           10_000_000 + k)
        data = [(prompt, *reference_episode(self.taskset, task, self.engine.tokenizer))
                for task, prompt in zip(tasks, self._prompts(self.engine, tasks))]
        count = sum(sum(mask) for _, _, mask in data)
        datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
        out = self.engine.forward_backward(datums, "cross_entropy")
        self.engine.optim_step({"learning_rate": self.resolved.warm_start_learning_rate})
        losses.append(float(out.metrics["loss:sum"]))
        tokens.append(count / len(data))
        if rules.warm_start_reached(losses, tokens):
            break
    (Path(self.run_dir) / "warm_start_steps.txt").write_text(f"{len(losses)}\n")
    return losses


if __name__ == "__main__":
    _Trainer._warm_start = warm_start_until_reached  # type: ignore[method-assign]
    sys.exit(main(["train", *sys.argv[1:]]))
