"""What the loop trains and ``wai serve`` serves: one ``Trainer`` protocol and its implementations.

    base.py     the ``Trainer`` protocol (operations, save / load / export / close), ``Needs``, ``refusals``
    engine.py   ``EngineTrainer``: the ``TrainingEngine`` in this process
    wai.py      ``WaiTrainer``: a run on a ``wai serve``, through its client (``wai train --url``)
    wai_client.py   that client (``Client``, ``Session``, ``RunClient``; ``whileai.service`` hands them on)
    tinker.py   ``TinkerTrainer``: a training client on a Tinker-API server, through the SDK (``--api tinker``)
    tinker_map.py   the engine's shapes <-> the SDK's types
    custom.py   ``forward_backward_custom`` as the SDK does it (both server trainers)
    remote.py   the checkpoint of a trainer whose weights stay on its server: a pointer in the run's folder
    open.py     ``open_trainer``: the trainer a run's config names

A new backend: a module here with a class that satisfies ``Trainer`` and an opener, and its line in
``open.SERVERS``; ``wai serve`` serves it through ``whileai.service.provider`` (a ``Provider`` that opens it).
"""

from whileai.trainers.base import Needs, Trainer, refusals
from whileai.trainers.open import open_trainer

__all__ = ["Needs", "Trainer", "open_trainer", "refusals"]
