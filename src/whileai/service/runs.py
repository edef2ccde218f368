"""Ordered, exactly-once execution of each run's operations.

Every operation of a run carries a sequence number ``seq_id``. A run executes number ``n`` only after
``n - 1``, whatever order the requests arrive in, on its own worker thread (runs never wait on each
other). A number is used up when its turn comes, whether the operation succeeds or fails, and its answer
is recorded in SQLite before anyone sees it. A request for a number already used gets the recorded
answer if its body is byte-for-byte the same (a retry) and a 409 if not. A request whose turn cannot
come because an earlier number never arrived fails after ``order_timeout`` seconds with a 408 that
names the missing number, and leaves its own number unused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whileai.errors import BatchError, ConfigError, WhileaiError
from whileai.service import schemas
from whileai.service.provider import Provider, Spec
from whileai.service.served import RunUnavailable, TrainerRun
from whileai.service.store import Store

log = logging.getLogger("whileai.service")

Answer = tuple[int, str]  # HTTP status, JSON text


def error_answer(status: int, kind: str, message: str, **extra: Any) -> Answer:
    return status, json.dumps({"error": {"type": kind, "message": message, **extra}})


def status_of(err: BaseException) -> int:
    if isinstance(err, RunUnavailable):
        return 409
    if isinstance(err, (BatchError, ConfigError, WhileaiError, ValueError)):
        return 400
    return 500


@dataclass
class Pending:
    """A request waiting for its turn."""

    seq: int
    op: str
    body: schemas.Op
    digest: str
    future: asyncio.Future[Answer]
    timer: asyncio.TimerHandle | None = None
    finished: bool = False  # it finished the run


@dataclass
class Slot:
    """One run's place in the server: its trainer's run (None until loaded), its order, its thread."""

    run_id: str
    spec: Spec
    next_seq: int
    step: int = 0
    trainer_run: TrainerRun | None = None
    pending: dict[int, Pending] = field(default_factory=dict)
    running: Pending | None = None
    closed: str | None = None  # why the run takes no more operations
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "wai-run"))
    task: asyncio.Task[None] | None = None


class Runner:
    """Every run this server knows, each with its queue and worker."""

    def __init__(self, store: Store, provider: Provider, runs_dir: Path, order_timeout: float) -> None:
        self.store = store
        self.provider = provider
        self.runs_dir = runs_dir
        self.order_timeout = order_timeout
        self.slots: dict[str, Slot] = {}

    # ------------------------------------------------------------------ runs
    async def create_run(self, session_id: str, owner: str, spec: Spec) -> str:
        """Load the run's model (on the run's own thread) and record the run; returns its id."""
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        slot = Slot(run_id, spec, next_seq=0)
        loop = asyncio.get_running_loop()
        try:
            slot.trainer_run = await loop.run_in_executor(slot.executor, lambda: self._open(run_id, spec, False))
        except BaseException:
            slot.executor.shutdown(wait=False)
            raise
        self.store.add_run(run_id, session_id, owner, spec)
        self._start(slot)
        return run_id

    def _open(self, run_id: str, spec: Spec, restarted: bool) -> TrainerRun:
        return TrainerRun(self.provider.open_trainer(spec, restarted=restarted), self.runs_dir / run_id, restarted)

    def _start(self, slot: Slot) -> None:
        self.slots[slot.run_id] = slot
        slot.task = asyncio.get_running_loop().create_task(self._work(slot))

    def slot(self, run: dict[str, Any]) -> Slot:
        """The run's slot; a run known only from the database (after a restart) gets one, not yet loaded."""
        if run["id"] not in self.slots:
            slot = Slot(run["id"], run["spec"], next_seq=self.store.next_seq(run["id"]), step=run["step"])
            if run["status"] != "open":
                slot.closed = f"the run is {run['status']}"
            self._start(slot)
        return self.slots[run["id"]]

    async def close_run(self, slot: Slot, why: str) -> None:
        """Refuse further operations, fail the waiting ones, free the model after the running one."""
        slot.closed = why
        for pending in list(slot.pending.values()):
            self._drop(slot, pending, error_answer(409, "RunUnavailable", f"{why}; operation {pending.seq} "
                                                                          "did not run"))
        slot.wake.set()
        if slot.trainer_run is not None:
            run, slot.trainer_run = slot.trainer_run, None
            await asyncio.get_running_loop().run_in_executor(slot.executor, run.close)

    # ------------------------------------------------------------------ submitting
    def submit(self, slot: Slot, op: str, body: schemas.Op, digest: str) -> asyncio.Future[Answer]:
        """The future answer of operation ``body.seq_id`` (a recorded answer for a retry)."""
        loop = asyncio.get_running_loop()
        seq = body.seq_id
        for waiting in (slot.running, slot.pending.get(seq)):
            if waiting is not None and waiting.seq == seq:
                return waiting.future if waiting.digest == digest else _done(loop, _conflict(slot, seq, waiting.op))
        if seq < slot.next_seq:
            row = self.store.operation(slot.run_id, seq)
            if row is None:
                return _done(loop, error_answer(410, "Gone", f"run {slot.run_id}: operation {seq} has no record"))
            if row["digest"] != digest:
                return _done(loop, _conflict(slot, seq, row["op"]))
            return _done(loop, (int(row["status"]), row["answer"]))
        if slot.closed:
            return _done(loop, error_answer(409, "RunUnavailable", f"run {slot.run_id}: {slot.closed}; it takes "
                                                                   "no more operations"))
        pending = Pending(seq, op, body, digest, loop.create_future())
        slot.pending[seq] = pending
        if seq > slot.next_seq:
            pending.timer = loop.call_later(self.order_timeout, self._check_order, slot, pending)
        slot.wake.set()
        return pending.future

    def answer_of(self, run_id: str, seq: int) -> asyncio.Future[Answer] | Answer | None:
        """For polling: the future of a waiting or running operation, a recorded answer, or None."""
        slot = self.slots.get(run_id)
        if slot is not None:
            for waiting in (slot.running, slot.pending.get(seq)):
                if waiting is not None and waiting.seq == seq:
                    return waiting.future
        row = self.store.operation(run_id, seq)
        return None if row is None else (int(row["status"]), row["answer"])

    def _check_order(self, slot: Slot, pending: Pending) -> None:
        """``order_timeout`` after a request arrived early: fail it if an earlier number never came."""
        if slot.pending.get(pending.seq) is not pending:
            return
        present = set(slot.pending) | ({slot.running.seq} if slot.running else set())
        missing = [s for s in range(slot.next_seq, pending.seq) if s not in present]
        if not missing:  # everything before it is here, only slow: keep waiting
            pending.timer = asyncio.get_running_loop().call_later(self.order_timeout, self._check_order, slot, pending)
            return
        self._drop(slot, pending, error_answer(
            408, "OrderTimeout", f"run {slot.run_id}: operation {pending.seq} waited {self.order_timeout:g} s for "
            f"operation {missing[0]}, which never arrived; operations run in seq_id order. Send seq_id "
            f"{missing[0]} (the run's next number is {slot.next_seq}), then retry {pending.seq}",
            missing=missing[0]))

    def _drop(self, slot: Slot, pending: Pending, answer: Answer) -> None:
        slot.pending.pop(pending.seq, None)
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.future.done():
            pending.future.set_result(answer)

    # ------------------------------------------------------------------ executing
    async def _work(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while slot.next_seq not in slot.pending:
                await slot.wake.wait()
                slot.wake.clear()
            pending = slot.pending.pop(slot.next_seq)
            if pending.timer is not None:
                pending.timer.cancel()
            slot.running = pending
            answer = await loop.run_in_executor(slot.executor, self._execute, slot, pending)
            slot.next_seq += 1
            slot.running = None
            pending.future.set_result(answer)
            if slot.closed is None and pending.finished:
                await self.close_run(slot, "the run is finished")

    def _execute(self, slot: Slot, pending: Pending) -> Answer:
        """Run one operation on the run's thread and record its answer (success or error)."""
        step = slot.step
        try:
            if slot.trainer_run is None:  # known from the database only: load the base model
                slot.trainer_run = self._open(slot.run_id, slot.spec, True)
            outcome = slot.trainer_run.execute(pending.op, pending.body)
        except Exception as err:  # a failing operation is this run's answer; other runs never see it
            if status_of(err) == 500:
                log.error("run %s op %s seq %d failed:\n%s", slot.run_id, pending.op, pending.seq,
                          traceback.format_exc())
            text = json.dumps({"error": {"type": type(err).__name__, "message": str(err)},
                               "seq_id": pending.seq, "op": pending.op})
            self.store.record(slot.run_id, pending.seq, pending.op, pending.digest, status_of(err), text, step)
            return status_of(err), text
        if outcome.saved_state is not None:
            self.store.add_state(slot.run_id, **outcome.saved_state)
        if outcome.spec_update:
            slot.spec = {**slot.spec, **outcome.spec_update}
            self.store.update_spec(slot.run_id, slot.spec)
        if outcome.finished:
            self.store.set_status(slot.run_id, "finished")
            pending.finished = True
        slot.step = outcome.step
        text = json.dumps({"request_id": f"{slot.run_id}.{pending.seq}", "run_id": slot.run_id,
                           "seq_id": pending.seq, "op": pending.op, "version": outcome.version,
                           "step": outcome.step, "result": outcome.result})
        self.store.record(slot.run_id, pending.seq, pending.op, pending.digest, 200, text, outcome.step)
        return 200, text

    async def shutdown(self) -> None:
        for slot in self.slots.values():
            if slot.task is not None:
                slot.task.cancel()
            slot.executor.shutdown(wait=False, cancel_futures=True)


def _conflict(slot: Slot, seq: int, op: str) -> Answer:
    return error_answer(409, "Conflict", f"run {slot.run_id}: operation {seq} was already sent as {op!r} with a "
                                         "different body; a retry must resend the same bytes. Use the next "
                                         f"number (>= {slot.next_seq}) for a new operation")


def _done(loop: asyncio.AbstractEventLoop, answer: Answer) -> asyncio.Future[Answer]:
    future: asyncio.Future[Answer] = loop.create_future()
    future.set_result(answer)
    return future
