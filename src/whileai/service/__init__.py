"""The training service: ``wai serve`` (FastAPI on uvicorn, SQLite under the data directory) and its client.

    from whileai.service import Client
    run = Client(url, token).create_session().create_run("builtin:tiny")

Only the client is imported here (httpx, no torch): it is one of the trainers, ``whileai.trainers.wai_client``; the
server lives in ``whileai.service.app``.
"""

from whileai.trainers.wai_client import (
    Client,
    ForwardResult,
    OptimResult,
    RunClient,
    ServiceError,
    Session,
    require_advertised_loss,
)

__all__ = ["Client", "ForwardResult", "OptimResult", "RunClient", "ServiceError", "Session",
           "require_advertised_loss"]
