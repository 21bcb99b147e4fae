"""find-batch-size's answer, typed: a `FindResult` *is* find_batch_size.json, the contract between
the command that measures it (catsdogs.measure.find_batch_size) and what reads it: the Python API's
`BatchSizeAdvice` (a view of it), the printed answer (catsdogs.measure.find_summary renders it) and
the report (catsdogs.analysis.time_to_target holds it against a sweep).

`to_dict` gives the file's object, its keys in the order the file has always had; `from_dict`
reads one back strictly: an object of known keys, each of its type, numbers finite, so a damaged
or foreign file is one line of CatsdogsError, not a KeyError where a field is first used. A key
absent from the file stays absent when it is written again (an older run's file round-trips).
No framework is imported here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from catsdogs.errors import CatsdogsError
from catsdogs.files import finite_or_null

STOPPED_BY = ("memory", "data", "max", "failures")


@dataclass
class FindResult:
    """find_batch_size.json's fields, in its order; `absent`: those its source left out."""

    largest_fitting: int | None  # the largest batch size that fits (measured); None: none did
    first_not_fitting: int | None = None  # the smallest that did not, above it
    reached_max: bool = False  # every size up to the search's bound fitted
    stopped_by: str | None = None  # what ended the search (STOPPED_BY)
    noise_scale: dict | None = None  # the noise scale's short runs and B_simple (noise_run.NoiseRun.as_json)
    margin_batch_size: int | None = None  # the largest less the margin, confirmed (where something fits)
    fastest: dict | None = None  # the size of the most images a second, of those that fit
    recommendation: dict | None = None  # what to train with (catsdogs.recommendation.recommend)
    hand_off: dict | None = None  # what a training run takes from the answer (recommendation.hand_off)
    margin_failed: list = field(default_factory=list)  # the margin's sizes that failed their confirmation
    settings: dict = field(default_factory=dict)  # the run's settings (FindSettings.recorded)
    search_bound: dict | None = None  # the search's bound and why (SearchBound.as_json)
    backend: str | None = None
    host: str | None = None
    cpu: dict | None = None  # the CPU: its model, cores, oneDNN's instruction set (host.cpu_record)
    prediction: dict | None = None  # the memory model's prediction and its parts
    memory_fraction: float | None = None  # of the device's memory the framework may use (XLA's)
    probes: list = field(default_factory=list)  # every probe, in the order run (ProbeRecord.view)
    versions: dict = field(default_factory=dict)
    seconds: dict | None = None  # where the time went
    model: dict | None = None  # a user's model and its data
    race: dict | None = None  # the race's measured answer (--race: catsdogs.measure.race_run)
    pool_ceiling: dict | None = None  # where an allocator's words ended the search (measure.gpu_pool)
    absent: frozenset = field(default=frozenset(), repr=False, compare=False)
    order: tuple = field(default=(), repr=False, compare=False)  # its source's order of keys (an older file's)

    @classmethod
    def answered(cls, **values) -> FindResult:
        """A result as find-batch-size writes it: where nothing fits, no margin, fastest or hand-off;
        no recommendation where none was made; no model's record for the article's model."""
        absent = set()
        if values.get("largest_fitting") is None:
            absent |= {"margin_batch_size", "fastest", "hand_off"}
        absent |= {k for k in ("recommendation", "model", "race", "pool_ceiling") if values.get(k) is None}
        return cls(**values, absent=frozenset(absent))

    def take_race(self, record: dict) -> None:
        """The race's record (catsdogs.measure.race_run) as its `race`, and the hand-off's batch size
        the measured fastest (it fits: it was raced)."""
        self.race = record
        self.absent = self.absent - {"race"}
        if record.get("decision") and self.hand_off:
            self.hand_off = {**self.hand_off, "batch_size": record["decision"]["batch_size"]}

    def to_dict(self) -> dict:
        """find_batch_size.json's object, its keys in its source's order (this version's otherwise)."""
        names = [f.name for f in fields(self) if f.name not in ("absent", "order") and f.name not in self.absent]
        ranked = {name: i for i, name in enumerate(self.order)}
        names.sort(key=lambda name: ranked.get(name, len(ranked)))  # (stable: this version's order for the rest)
        return {name: getattr(self, name) for name in names}

    def to_json(self, indent: int | None = 2) -> str:
        """find_batch_size.json's text (strict JSON: a NaN written as null)."""
        return json.dumps(finite_or_null(self.to_dict()), indent=indent)

    @classmethod
    def from_dict(cls, data) -> FindResult:
        """The result in find_batch_size.json's object; CatsdogsError, in one line, for anything else."""
        if not isinstance(data, dict):
            raise CatsdogsError(f"not find-batch-size's answer: a JSON object is due, got {_kind(data)}")
        if data.get("interrupted") is True:
            raise CatsdogsError("an interrupted find-batch-size run holds no answer: run it again")
        if "largest_fitting" not in data:
            raise CatsdogsError("not find-batch-size's answer: no 'largest_fitting' in it")
        known = {f.name for f in fields(cls)} - {"absent", "order"}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise CatsdogsError(f"not find-batch-size's answer as this catsdogs writes it: unknown key {unknown[0]!r}")
        for key, value in data.items():
            _check(key, value)
        return cls(**data, absent=frozenset(known - set(data)), order=tuple(data))

    @classmethod
    def from_json(cls, source: str | Path) -> FindResult:
        """The result in find_batch_size.json's text, or in the file at a Path."""
        if isinstance(source, Path):
            try:
                source = source.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise CatsdogsError(f"cannot read {source}: {getattr(exc, 'strerror', None) or exc}") from None
        if not isinstance(source, (str, bytes, bytearray)):
            raise CatsdogsError(f"find-batch-size's JSON is text or a Path, got {_kind(source)}")
        try:
            data = json.loads(source, parse_constant=_no_constant)
        except RecursionError:
            raise CatsdogsError("not find-batch-size's JSON: nested too deeply") from None
        except (ValueError, TypeError) as exc:
            hint = ""
            if isinstance(source, str) and len(source) < 4096 and "\n" not in source and Path(source).is_file():
                hint = f" (a path? give Path({source!r}))"
            raise CatsdogsError(f"not find-batch-size's JSON: {exc}{hint}") from None
        return cls.from_dict(data)


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


# what each key holds: (a test, what it says is due); None passes every key but largest_fitting's
_BATCH = (lambda v: v is None or (_is_int(v) and v >= 1), "a batch size (a whole number from 1) or null")
_OBJECT = (lambda v: v is None or isinstance(v, dict), "an object or null")
_SHAPES = {
    "largest_fitting": _BATCH, "first_not_fitting": _BATCH, "margin_batch_size": _BATCH,
    "reached_max": (lambda v: isinstance(v, bool), "true or false"),
    "stopped_by": (lambda v: v is None or v in STOPPED_BY, f"one of {', '.join(STOPPED_BY)} or null"),
    "noise_scale": _OBJECT, "fastest": _OBJECT, "recommendation": _OBJECT, "hand_off": _OBJECT,
    "search_bound": _OBJECT, "cpu": _OBJECT, "prediction": _OBJECT, "seconds": _OBJECT, "model": _OBJECT, "race": _OBJECT,
    "pool_ceiling": _OBJECT,
    "settings": (lambda v: isinstance(v, dict), "an object"), "versions": (lambda v: isinstance(v, dict), "an object"),
    "margin_failed": (lambda v: isinstance(v, list) and all(_is_int(b) for b in v), "a list of batch sizes"),
    "probes": (lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v), "a list of objects"),
    "backend": (lambda v: v is None or isinstance(v, str), "text or null"),
    "host": (lambda v: v is None or isinstance(v, str), "text or null"),
    "memory_fraction": (lambda v: v is None or (_is_number(v) and v > 0), "a positive number or null"),  # > 1: oversubscribed
}
# the fields the advice reads inside the objects, each of its type
_INSIDE = {
    "recommendation": {"batch_size": _BATCH,
                       "learning_rate": (lambda v: v is None or (_is_number(v) and v > 0), "a positive number or null"),
                       "learning_rate_rule": (lambda v: v is None or isinstance(v, str), "text or null"),
                       "binding": (lambda v: v is None or isinstance(v, str), "text or null"),
                       "near_best": (lambda v: v is None or (isinstance(v, list) and all(_is_int(b) for b in v)),
                                     "a list of batch sizes or null"),
                       "table": (lambda v: v is None or (isinstance(v, list) and all(isinstance(r, dict) for r in v)),
                                 "a list of objects or null")},
    "noise_scale": {k: (lambda v: v is None or _is_number(v), "a number or null") for k in ("b_simple", "low", "high")},
    "fastest": {"batch_size": _BATCH},
    "race": {"target": (lambda v: isinstance(v, str), "text"),
             "decision": (lambda v: v is None or _decision(v), "null or an object of batch_size, lr, seconds, "
                          "seconds_low and seconds_high (positive numbers; the last null where open) and tied "
                          "(a list of objects of a batch_size)")},
    "hand_off": {"eval_batch_size": _BATCH, "accumulation": _OBJECT},
}


def _decision(v) -> bool:
    """The race's decision as the advice reads it (BatchSizeAdvice.of)."""
    positive = lambda x: _is_number(x) and x > 0  # noqa: E731
    return (isinstance(v, dict) and _is_int(v.get("batch_size")) and v["batch_size"] >= 1 and positive(v.get("lr"))
            and positive(v.get("seconds")) and positive(v.get("seconds_low"))
            and (v.get("seconds_high") is None or positive(v["seconds_high"]))
            and isinstance(v.get("tied"), list)
            and all(isinstance(t, dict) and _is_int(t.get("batch_size")) for t in v["tied"]))


def _check(key: str, value) -> None:
    test, due = _SHAPES[key]
    if not test(value):
        raise CatsdogsError(f"find_batch_size.json: {key} must be {due}, got {_short(value)}")
    for inner, (test, due) in _INSIDE.get(key, {}).items() if isinstance(value, dict) else ():
        if inner in value and not test(value[inner]):
            raise CatsdogsError(f"find_batch_size.json: {key}.{inner} must be {due}, got {_short(value[inner])}")


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
