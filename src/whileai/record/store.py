"""What ``wai record`` keeps, in SQLite under the data directory (``record.db``, WAL).

    exchanges  one request and its reply: the prompt's and the completion's token ids, the behavior
               log-probabilities, the sampling settings, the model, weights version and logprobs mode the
               upstream reported, the conversation key after the reply, ``parent`` (the exchange this one
               continues, or NULL), and ``problem`` (why it cannot train, or NULL)
    traces     a conversation's id, its last exchange (``tip``), and the late reward with when it came and
               ``scored_seq``: its place in the order traces were first scored (1, 2, ...; NULL unscored), the
               cursor ``wai train --rows-from`` reads new scored traces by

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
    reward REAL, scored REAL, scored_seq INTEGER);
"""
SEQ_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS traces_scored_seq ON traces (scored_seq)"


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
        self._add_scored_seq()

    def _add_scored_seq(self) -> None:
        """A database written before ``scored_seq`` gets the column, its scored traces numbered by score time."""
        with self._write() as db:
            if "scored_seq" not in {row["name"] for row in db.execute("PRAGMA table_info(traces)")}:
                db.execute("ALTER TABLE traces ADD COLUMN scored_seq INTEGER")
                ids = [row["id"] for row in db.execute("SELECT id FROM traces WHERE reward IS NOT NULL "
                                                       "ORDER BY scored, id")]
                db.executemany("UPDATE traces SET scored_seq = ? WHERE id = ?",
                               [(k, trace_id) for k, trace_id in enumerate(ids, start=1)])
            db.execute(SEQ_INDEX)

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
        """Attach ``reward``; returns the reward it replaced (None). Raises UnknownTrace / AlreadyScored. A first
        score takes the next ``scored_seq``; a replaced score keeps its place (a reader past it does not see it
        again)."""
        with self._write() as db:
            row = db.execute("SELECT reward FROM traces WHERE id = ?", (trace_id,)).fetchone()
            if row is None:
                raise UnknownTrace(trace_id)
            if row["reward"] is not None and not replace:
                raise AlreadyScored(float(row["reward"]))
            db.execute("UPDATE traces SET reward = ?, scored = ?, scored_seq = COALESCE(scored_seq, "
                       "(SELECT COALESCE(MAX(scored_seq), 0) + 1 FROM traces)) WHERE id = ?",
                       (reward, time.time(), trace_id))
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

    def scored_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` scored traces whose ``scored_seq`` is above ``cursor``, in that order."""
        return self.rows("SELECT * FROM traces WHERE scored_seq > ? ORDER BY scored_seq LIMIT ?", cursor, limit)

    def unscored(self) -> int:
        """How many recorded traces wait for a score."""
        return int(self.rows("SELECT COUNT(*) AS n FROM traces WHERE reward IS NULL")[0]["n"])
