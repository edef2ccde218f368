"""The method contract: a frozen, validated config whose ``update(batch)`` returns an ``Update``.

A method subclass is a frozen dataclass whose fields are declared with ``knob()``, so
its defaults, docs and validation rules come from the one table in ``defaults.py``; a field it inherits
takes its own row's entry where the row has one. Construction
and ``.replace(...)`` validate every field and report every bad one at once, as a ``ConfigError``
(a ``ValueError``) naming the field, the value and the valid range.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, dataclass_transform

import numpy as np

from whileai.errors import ConfigError
from whileai.knobs import Knob
from whileai.methods.defaults import DEFAULTS
from whileai.methods.losses import as_pairs
from whileai.methods.run_spec import RunSpec
from whileai.rows.batch import Batch, as_batch

# Old knob names, each accepted for one more release with a one-line DeprecationWarning (wai.method, the
# classes, replace, --set, a config file's [knobs]): rollouts per prompt has one name across the package.
DEPRECATED: dict[str, str] = {"generations": "rollouts_per_prompt", "samples": "rollouts_per_prompt"}


def renamed(cls: type, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` with each deprecated knob name ``cls`` does not have put under its one name, warned once."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    out = dict(changes)
    for old, new in DEPRECATED.items():
        if old in out and old not in fields and new in fields:
            if new in out:
                raise ConfigError(f"{cls.__name__}: give {new}= only ({old}= is its deprecated name)")
            warnings.warn(f"{cls.__name__}({old}=...) is deprecated: the knob is {new} (one name for rollouts per "
                          "prompt); the old name goes in the next release", DeprecationWarning, stacklevel=3)
            out[new] = out.pop(old)
    return out


CAP = "max_tokens"
"""the standard field of a method's generation cap per trajectory (what ``run_spec().max_tokens`` reports)"""
# name -> method class; filled by subclasses that set ``name`` (see Method.__init_subclass__)
REGISTRY: dict[str, type[Method]] = {}


def knob(row: str | None = None) -> Any:
    """A method's knob field: ``rollouts_per_prompt: int = knob()``. The field's name is the knob's name, and its
    default, doc and rule are its row of the knob table (``DEFAULTS[cls.name][field name]``); ``row`` names
    another method's row, for a base class without a name of its own. Bound when the class is made."""
    return field(default=None, metadata={KNOB_ROW: row})


KNOB_ROW = "knob_row"


def _knob_field(method: str, name: str) -> Any:
    """The dataclass field of ``DEFAULTS[method][name]``: its value as the default, the ``Knob`` as metadata."""
    spec = DEFAULTS[method][name]
    return field(default=spec.value, metadata={"knob": spec})


def _row_of(cls: type) -> str | None:
    """The knob table row of ``cls``: its ``name``, or the ``knob_row`` a base class without a name reads."""
    return cls.__dict__.get("name") or cls.__dict__.get("knob_row")


def _declare_knobs(cls: type) -> None:
    """Each ``knob()`` field ``cls`` declares becomes its row's field (runs before ``@dataclass``); a shared
    base's (``Sampled``) stay as they are, for the classes below it to place."""
    for attr, value in list(cls.__dict__.items()):
        if isinstance(value, dataclasses.Field) and KNOB_ROW in value.metadata:
            if row := value.metadata[KNOB_ROW] or _row_of(cls):
                setattr(cls, attr, _knob_field(row, attr))


def _place_shared(cls: type, row: str) -> None:
    """Each knob of a ``shared`` base above ``cls`` that no dataclass base of ``cls`` has yet becomes ``cls``'s own
    field, placed after the knob that comes before it in ``cls``'s row of the knob table (runs before
    ``@dataclass``), so the field order, the repr and positional construction are those the class had when it
    wrote the field itself."""
    have = getattr(cls, "__dataclass_fields__", {})
    own: dict[str, Any] = dict(cls.__dict__.get("__annotations__", {}))
    names, table = list(own), list(DEFAULTS.get(row, {}))
    for base in reversed(cls.__mro__):
        for name, kind in (base.__dict__.get("__annotations__", {}) if base in SHARED else {}).items():
            if name in have or name in own:
                continue
            if name not in table:
                raise TypeError(f"{cls.__name__} derives from {base.__name__} but its row {row!r} of the knob table "
                                f"(methods/defaults.py) has no {name!r}")
            before = [k for k in table[:table.index(name)] if k in names]
            names.insert(names.index(before[-1]) + 1 if before else 0, name)
            own[name] = kind
            setattr(cls, name, _knob_field(row, name))
    cls.__annotations__ = {n: own[n] for n in names}


def _bind_own_row(cls: type, name: str) -> None:
    """A knob field ``cls`` inherits takes its default and rule from ``cls``'s own row (``name``) where that row
    names it, so a subclass declares only the fields it adds (runs before ``@dataclass``, which keeps the
    inherited field's place in the order)."""
    row = DEFAULTS.get(name, {})
    own = cls.__dict__.get("__annotations__", {})
    for f in getattr(cls, "__dataclass_fields__", {}).values():
        if "knob" in f.metadata and f.name in row and f.name not in own:
            cls.__annotations__[f.name] = f.type
            setattr(cls, f.name, _knob_field(name, f.name))


# The run spec's settings a method declares as fields (or class attributes) of the same name: ``run_spec()``
# reads them by these names, so a method states its temperature, cap, rollouts per prompt, learning rate and
# engine loss once, as fields; a method with a ``loss`` and a ``loss_config()`` sends that config too.
STANDARD_FIELDS = ("rollouts_per_prompt", "temperature", "max_tokens", "learning_rate", "loss")


class _Built(type):
    """Records which fields a method object was given (``Method.set_fields``): a knob left out keeps its declared
    default and its source says so, so a run can still fill it (the plan's generation cap into Dr. GRPO's L_max)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        kwargs = renamed(cls, kwargs)
        made = super().__call__(*args, **kwargs)
        names = [f.name for f in dataclasses.fields(made) if f.init]
        object.__setattr__(made, "_set", frozenset(names[:len(args)]) | frozenset(kwargs))
        return made


@dataclass(frozen=True)
class Method(metaclass=_Built):
    """Base class of every method. Subclasses set ``name`` and implement ``_update``."""

    name: ClassVar[str] = ""
    # per-token row fields the update cannot run without, with the reason (checked up front)
    requires: ClassVar[dict[str, str]] = {}

    # run spec settings fixed for the class, e.g. {"max_lag": None, "min_rollouts_per_prompt": 2}
    run_settings: ClassVar[Mapping[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _declare_knobs(cls)
        if row := _row_of(cls):
            _place_shared(cls, row)
            _bind_own_row(cls, row)
        if "name" in cls.__dict__ and cls.name:
            REGISTRY[cls.name] = cls

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):  # accept [a, b] for a pair
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            spec: Knob | None = f.metadata.get("knob")
            if spec is not None and (rule := spec.check(value)) is not None:
                problems.append(f"{type(self).__name__}.{f.name}={value!r} is invalid: it must be {rule} "
                                f"({spec.doc}; default {spec.value!r})")
        problems += self._check()
        if problems:
            raise ConfigError("; ".join(problems))

    def _check(self) -> list[str]:
        """Rules that involve more than one field; return one sentence per problem."""
        return []

    # ----------------------------------------------------------------- public API
    def replace(self, **changes: Any) -> Method:
        """A copy with some fields changed, validated like a new object."""
        changes = renamed(type(self), changes)
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise ConfigError(f"{type(self).__name__} has no field {unknown[0]!r}; its fields are {', '.join(names)}")
        return self._replaced(changes)

    def _replaced(self, changes: Mapping[str, Any]) -> Method:
        made = dataclasses.replace(self, **changes)
        object.__setattr__(made, "_set", self.set_fields() | frozenset(changes))
        return made

    def set_fields(self) -> frozenset[str]:
        """The fields this object was given (at construction or by ``replace``); every other field holds its
        declared default."""
        return getattr(self, "_set", frozenset())

    def with_cap(self, cap: int) -> Method:
        """This method with ``cap`` (the run's generation budget) as its generation cap where the cap was left at
        its declared default, in a wrapped method too: an update that reads the cap (Dr. GRPO's L_max) then
        divides by the budget the replies really had. A cap the user set stays theirs."""
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == CAP and f.name not in self.set_fields() and value != cap:
                changes[f.name] = cap
            elif isinstance(value, Method) and (inner := value.with_cap(cap)) is not value:
                changes[f.name] = inner
        if not changes:
            return self
        made = dataclasses.replace(self, **changes)
        object.__setattr__(made, "_set", self.set_fields())  # the filled cap is still the run's, not the user's
        return made

    def update(self, batch: Batch | Iterable[Mapping[str, Any]], *, state: Mapping[str, Any] | None = None) -> Update:
        """Coefficients for every token of ``batch`` (a list of row dicts or a ``Batch``).

        ``state``: for a method whose ``run_spec().stateful`` is true, the state before this update (start
        from ``initial_state()``); the returned ``Update.state`` is the state after it. The input is never
        changed, so a loop owns the state and can checkpoint it.
        """
        batch = as_batch(batch)
        for name, why in self.requires.items():
            batch.require(name, self.name, why)
        update = self._update(batch) if state is None else self._update_with_state(batch, state)
        update.notes.extend(batch.field_notes)  # a misspelt field is said, never silently ignored
        return update

    def _update(self, batch: Batch) -> Update:
        raise NotImplementedError(f"{type(self).__name__} does not define _update")

    def _update_with_state(self, batch: Batch, state: Mapping[str, Any]) -> Update:
        raise ConfigError(f"{type(self).__name__} carries no state across updates; call update(batch) without "
                          "state= (run_spec().stateful is False)")

    def run_spec(self) -> RunSpec:
        """How this method must be run: its ``STANDARD_FIELDS`` as they are, its class's ``run_settings``, and
        ``_run_spec()``'s settings that depend on its fields (needs, a critic, a teacher, a lag)."""
        own = {name: getattr(self, name) for name in STANDARD_FIELDS if hasattr(self, name)}
        if "loss" in own and hasattr(self, "loss_config"):
            own["loss_config"] = as_pairs(self.loss_config())
        return RunSpec(**{**own, **self.run_settings, **self._run_spec()})

    def _run_spec(self) -> dict[str, Any]:
        """The run spec's settings that this method computes from its fields (beyond ``STANDARD_FIELDS``)."""
        return {}

    def initial_state(self) -> dict[str, Any] | None:
        """The state a stateful method starts from (None for a stateless one)."""
        return None

    @classmethod
    def knobs(cls) -> dict[str, Knob]:
        """The declared defaults of this method, by field name."""
        return {f.name: f.metadata["knob"] for f in dataclasses.fields(cls) if "knob" in f.metadata}


# The sampling knobs, declared once: a method the loop samples for derives from ``Sampled`` (``SampledPerPrompt``
# when it draws several rollouts per prompt); its own row of the knob table holds its paper values.
SHARED: list[type] = []
"""the bases whose knobs each method below them takes as its own fields (``_place_shared``)"""
M = TypeVar("M", bound=type)


@dataclass_transform(kw_only_default=True, frozen_default=True)
def shared(cls: M) -> M:
    """A base whose knobs are declared once for the methods below it. To the type checker they are keyword-only
    fields (``wai.GRPO(temperature=0.7)`` is checked); at run time each method takes them as its own fields at
    its row's place (``_place_shared``): the field order, repr and positional construction it had before."""
    SHARED.append(cls)
    return cls


@shared
class Sampled(Method):
    """A method whose rows the loop samples: the temperature they are drawn (and scored) at and the generation cap."""

    temperature: float = knob()
    max_tokens: int = knob()


@shared
class SampledPerPrompt(Sampled):
    """A sampled method that draws ``rollouts_per_prompt`` rollouts of each prompt (a group, or several samples)."""

    rollouts_per_prompt: int = knob()


@dataclass
class Update:
    """What an update did: per-token coefficients, advantages, who was admitted, and why."""

    method: str
    coefficients: list[np.ndarray]
    advantages: list[np.ndarray]
    admitted: np.ndarray
    stats: dict[str, float]
    notes: list[str] = field(default_factory=list)
    value_targets: list[np.ndarray] | None = None
    state: dict[str, Any] | None = None
    """a stateful method's state after this update (when ``update`` was given ``state=``)"""
    drift: float | None = None
    """the method's own measure of how far the sampler's policy is from the trained one (FlashReinforce's mean
    sequence Bernoulli KL); None: the loop's k3 estimate stands in"""

    @property
    def coefficients_flat(self) -> np.ndarray:
        return np.concatenate(self.coefficients) if self.coefficients else np.zeros(0)

    def __str__(self) -> str:
        lines = [f"{self.method} update: {int(self.admitted.sum())} of {len(self.admitted)} trajectories admitted"]
        lines += [f"  {key.replace('_', ' ')}: {_short(value)}" for key, value in self.stats.items()]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and floats, for JSON."""
        out: dict[str, Any] = {
            "method": self.method,
            "admitted": [bool(a) for a in self.admitted],
            # + 0.0 turns a -0.0 (a negative advantage times a zero mask) into 0.0 for readers of the JSON
            "coefficients": [(c + 0.0).tolist() for c in self.coefficients],
            "advantages": [(a + 0.0).tolist() for a in self.advantages],
            "stats": {k: float(v) for k, v in self.stats.items()},
            "notes": list(self.notes),
        }
        if self.value_targets is not None:
            out["value_targets"] = [v.tolist() for v in self.value_targets]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _short(value: float) -> str:
    """0.5 -> '0.5', 0.17461 -> '0.1746': four decimals, trailing zeros dropped."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def trajectory_list(indices: np.ndarray) -> str:
    """'(3)' or '(1, 4, 7)', capped at eight indices."""
    shown = ", ".join(str(int(i)) for i in indices[:8])
    return f"({shown}{', ...' if len(indices) > 8 else ''})"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"
