"""What ``wai record`` keeps, in SQLite under the data directory (``record.db``, WAL).

    exchanges  one request and its reply: the prompt's and the completion's token ids, the behavior
               log-probabilities, the sampling settings, the model, weights version and logprobs mode the
               upstream reported, the conversation key after the reply, ``parent`` (the exchange this one
               continues, or NULL), and ``problem`` (why it cannot train, or NULL)
    traces     a conversation's id, its last exchange (``tip``), and the late reward with when it came

A trace is the chain of exchanges from its tip back through ``parent``. A row is committed before the
client gets its answer (WAL, ``synchronous=FULL``), so an acknowledged trace or reward survives a killed
process. No request header is stored (an upstream API key passes through and is never written).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from whileai.database import Database

DB_NAME = "record.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS exchanges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id TEXT NOT NULL, parent INTEGER, endpoint TEXT NOT NULL,
    model TEXT, weights_version TEXT, logprobs_mode TEXT NOT NULL, sampling TEXT NOT NULL,
    prompt_ids TEXT NOT NULL, completion_ids TEXT NOT NULL, logprobs TEXT, finish_reason TEXT,
    conversation_key TEXT, problem TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS exchanges_key ON exchanges (conversation_key);
CREATE TABLE IF NOT EXISTS traces (
    id TEXT PRIMARY KEY, tip INTEGER NOT NULL, model TEXT, created REAL NOT NULL, updated REAL NOT NULL,
    reward REAL, scored REAL);
"""


class UnknownTrace(LookupError):
    """A trace id the store does not hold."""


class AlreadyScored(Exception):
    """A second reward for a trace without ``replace``."""

    def __init__(self, reward: float) -> None:
        super().__init__(reward)
        self.reward = reward


class RecordStore(Database):
    """The recorder's database at ``data_dir/record.db``; one connection, one lock."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, DB_NAME, SCHEMA, "FULL")

    # ------------------------------------------------------------------ conversations
    def continues(self, key: str) -> dict[str, Any] | None:
        """The latest exchange whose conversation (messages + reply) was ``key``, with its trace's state."""
        found = self.rows("SELECT e.id, e.trace_id, e.prompt_ids, e.completion_ids, t.tip, t.reward "
                          "FROM exchanges e JOIN traces t ON t.id = e.trace_id WHERE e.conversation_key = ? "
                          "ORDER BY e.id DESC LIMIT 1", key)
        return found[0] if found else None

    def add_exchange(self, trace_id: str, parent: int | None, fields: dict[str, Any]) -> int:
        """Write one exchange and make it its trace's tip (a new trace when ``trace_id`` is new)."""
        now = time.time()
        cols = dict(fields, trace_id=trace_id, parent=parent, created=now)
        for name in ("sampling", "prompt_ids", "completion_ids", "logprobs"):
            cols[name] = None if cols.get(name) is None else json.dumps(cols[name])
        with self._write() as db:
            cursor = db.execute(f"INSERT INTO exchanges ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                tuple(cols.values()))
            exchange = int(cursor.lastrowid or 0)
            db.execute("INSERT INTO traces (id, tip, model, created, updated) VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) "
                       "DO UPDATE SET tip = excluded.tip, updated = excluded.updated",
                       (trace_id, exchange, fields.get("model"), now, now))
        return exchange

    # ------------------------------------------------------------------ rewards
    def score(self, trace_id: str, reward: float, replace: bool) -> float | None:
        """Attach ``reward``; returns the reward it replaced (None). Raises UnknownTrace / AlreadyScored."""
        with self._write() as db:
            row = db.execute("SELECT reward FROM traces WHERE id = ?", (trace_id,)).fetchone()
            if row is None:
                raise UnknownTrace(trace_id)
            if row["reward"] is not None and not replace:
                raise AlreadyScored(float(row["reward"]))
            db.execute("UPDATE traces SET reward = ?, scored = ? WHERE id = ?", (reward, time.time(), trace_id))
        return None if row["reward"] is None else float(row["reward"])

    # ------------------------------------------------------------------ reading
    def trace(self, trace_id: str) -> dict[str, Any]:
        """A trace and its exchanges, oldest first."""
        found = self.rows("SELECT * FROM traces WHERE id = ?", trace_id)
        if not found:
            raise UnknownTrace(trace_id)
        return {**found[0], "exchanges": self.chain(int(found[0]["tip"]))}

    def chain(self, tip: int) -> list[dict[str, Any]]:
        chain, at = [], tip
        while at is not None:
            row = self.rows("SELECT * FROM exchanges WHERE id = ?", at)[0]
            for name in ("sampling", "prompt_ids", "completion_ids", "logprobs"):
                row[name] = None if row[name] is None else json.loads(row[name])
            chain.append(row)
            at = row["parent"]
        return chain[::-1]

    def traces(self, since: float | None = None, model: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM traces WHERE 1 = 1", list[Any]()
        if since is not None:
            sql, args = sql + " AND created >= ?", [*args, since]
        if model is not None:
            sql, args = sql + " AND model = ?", [*args, model]
        return self.rows(sql + " ORDER BY created, id", *args)
