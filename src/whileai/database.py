"""One SQLite database file shared by the threads of a server: WAL, one writer at a time, whole transactions.

The training service (``whileai.service.store``) and the recorder (``whileai.record.store``) keep their state
this way; each subclass declares its schema and its durability.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Database:
    """``data_dir/name`` opened once; ``_write()`` is one immediate transaction under the lock."""

    def __init__(self, data_dir: Path, name: str, schema: str, synchronous: str) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / name
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.lock = threading.Lock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(schema)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.db.execute(sql, args).fetchall()]

    def close(self) -> None:
        with self.lock:
            self.db.close()
