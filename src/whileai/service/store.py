"""What the service keeps across restarts, in SQLite under the data directory (``service.db``, WAL).

Tables: ``sessions`` and ``runs`` (who owns what, how each run was made, its last step), ``operations``
(every operation a run executed: sequence number, body digest, HTTP status and the answer, so a retry
gets the same answer without running again), and ``states`` (each ``save_state``, recorded only after
its files are written and synced). One connection, one lock: a single writer. Commits use
``synchronous=NORMAL``, which WAL makes durable across a killed process; a saved state's row is
committed with ``synchronous=FULL`` (durable across a power cut as well).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from whileai.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
                                     closed REAL);
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, owner TEXT NOT NULL,
                                 spec TEXT NOT NULL, status TEXT NOT NULL, step INTEGER NOT NULL,
                                 created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS operations (run_id TEXT NOT NULL, seq INTEGER NOT NULL, op TEXT NOT NULL,
                                       digest TEXT NOT NULL, status INTEGER NOT NULL, answer TEXT NOT NULL,
                                       finished REAL NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS states (run_id TEXT NOT NULL, name TEXT NOT NULL, path TEXT NOT NULL,
                                   step INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (run_id, name));
"""


class Store(Database):
    """The service's SQLite database at ``data_dir/service.db``."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, "service.db", SCHEMA, "NORMAL")

    # ------------------------------------------------------------------ sessions and runs
    def add_session(self, session_id: str, owner: str) -> None:
        with self._write() as db:
            db.execute("INSERT INTO sessions VALUES (?, ?, ?, NULL)", (session_id, owner, time.time()))

    def session(self, session_id: str) -> dict[str, Any] | None:
        rows = self.rows("SELECT * FROM sessions WHERE id = ?", session_id)
        return rows[0] if rows else None

    def sessions(self, owner: str) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM sessions WHERE owner = ? AND closed IS NULL ORDER BY created", owner)

    def close_session(self, session_id: str) -> None:
        with self._write() as db:
            db.execute("UPDATE sessions SET closed = ? WHERE id = ?", (time.time(), session_id))
            db.execute("UPDATE runs SET status = 'closed' WHERE session_id = ? AND status = 'open'", (session_id,))

    def add_run(self, run_id: str, session_id: str, owner: str, spec: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, 'open', 0, ?)",
                       (run_id, session_id, owner, json.dumps(spec), time.time()))

    def update_spec(self, run_id: str, spec: dict[str, Any]) -> None:
        with self._write() as db:
            db.execute("UPDATE runs SET spec = ? WHERE id = ?", (json.dumps(spec), run_id))

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.rows("SELECT * FROM runs WHERE id = ?", run_id)
        return _run(rows[0]) if rows else None

    def runs(self, session_id: str) -> list[dict[str, Any]]:
        return [_run(r) for r in self.rows("SELECT * FROM runs WHERE session_id = ? ORDER BY created", session_id)]

    def set_status(self, run_id: str, status: str) -> None:
        with self._write() as db:
            db.execute("UPDATE runs SET status = ? WHERE id = ?", (status, run_id))

    # ------------------------------------------------------------------ operations
    def record(self, run_id: str, seq: int, op: str, digest: str, status: int, answer: str, step: int) -> None:
        """One executed operation and the run's step after it, in one transaction."""
        with self._write() as db:
            db.execute("INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (run_id, seq, op, digest, status, answer, time.time()))
            db.execute("UPDATE runs SET step = ? WHERE id = ?", (step, run_id))

    def operation(self, run_id: str, seq: int) -> dict[str, Any] | None:
        rows = self.rows("SELECT * FROM operations WHERE run_id = ? AND seq = ?", run_id, seq)
        return rows[0] if rows else None

    def next_seq(self, run_id: str) -> int:
        rows = self.rows("SELECT MAX(seq) AS last FROM operations WHERE run_id = ?", run_id)
        return 0 if rows[0]["last"] is None else int(rows[0]["last"]) + 1

    def history(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.rows("SELECT seq, op, status, answer, finished FROM operations WHERE run_id = ? ORDER BY seq",
                          run_id)
        out = []
        for row in rows:
            answer = json.loads(row.pop("answer"))
            out.append({"seq_id": row["seq"], "op": row["op"], "status": row["status"],
                        "version": answer.get("version"), "step": answer.get("step"), "finished": row["finished"]})
        return out

    # ------------------------------------------------------------------ saved states
    def add_state(self, run_id: str, name: str, path: str, step: int) -> None:
        with self.lock:
            self.db.execute("PRAGMA synchronous=FULL")
            try:
                self.db.execute("INSERT OR REPLACE INTO states VALUES (?, ?, ?, ?, ?)",
                                (run_id, name, path, step, time.time()))
            finally:
                self.db.execute("PRAGMA synchronous=NORMAL")

    def states(self, run_id: str) -> list[dict[str, Any]]:
        return self.rows("SELECT name, path, step, created FROM states WHERE run_id = ? ORDER BY created", run_id)


def _run(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "spec": json.loads(row["spec"])}
