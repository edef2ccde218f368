"""Without the Tinker SDK installed, `wai serve` still starts, and every /api/v1 route says how to add it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from whileai.service.app import ServeConfig, create_app


def test_without_the_sdk_the_tinker_routes_answer_501_with_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tinker", None)  # `import tinker` now raises ImportError
    app = create_app(ServeConfig(data_dir=tmp_path, tokens=["tml-" + "a" * 20]))
    with TestClient(app) as http:
        answer = http.post("/api/v1/create_session", json={})
        assert answer.status_code == 501
        assert answer.json()["error"] == ("/api/v1/create_session: this wai serve has no Tinker support; install "
                                          "it with `pip install whileai[tinker]` and restart")
        assert http.get("/healthz").status_code == 200  # the service's own routes are unaffected
