"""The Python API's inputs checked and read before any work, as the command line's options are
parsed: one table of what each keyword takes (`KEYWORDS`: its kind and bounds, which the command
line's options of the same meaning take their types from, `click_type`), whole numbers and flags
(numpy's taken), a memory limit, and data as Keras users hold it (a `tf.data.Dataset`, a
`keras.utils.PyDataset`) read into arrays. Each refusal a SettingError naming the keyword."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import click

from catsdogs.errors import SettingError
from catsdogs.schema import DATASETS, LIMITS, OPTIMIZERS, PRECISIONS, check_at_most, shown

YEAR = 365 * 24 * 3600.0  # seconds: a budget beyond a year is a typo
MOST_PAIRS = 1024  # a noise measurement's pairs (and micro-batches a pair) at most


@dataclass(frozen=True)
class Keyword:
    """What one keyword argument takes: `kind` "whole" or "number" (from `low`, to `high` or the
    key's schema.LIMITS; `open_high`: below it), "flag", "choice" (`choices`), "path", "text",
    "log" (a callable taking a line), "env" (a mapping of names to strings) or "paths" (several
    paths, not one string); None is always taken (the default's "not given")."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_high: bool = False
    choices: tuple[str, ...] = ()
    why: str = ""  # why `high` is the limit, said with a value above it

    def check(self, value, key: str):
        """`value` as the run takes it (numpy's numbers as Python's, a path as a Path), or a
        SettingError naming `key` that says what is taken."""
        if value is None:
            return None
        if self.kind in ("whole", "number"):
            return self._number(value, key)
        if self.kind == "flag":
            return flag(value, key)
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise SettingError(f"unknown {key} {value!r}; choose from {', '.join(self.choices)}", key)
            return value
        if self.kind == "path":
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                raise SettingError(f"a path (a str or a Path), got {value!r} ({type(value).__name__})", key)
            return value
        if self.kind == "paths":
            if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
                raise SettingError(f"a list of paths, got {type(value).__name__}", key)
            return [self.__class__("path").check(v, key) for v in value]
        if self.kind == "text":
            if not isinstance(value, str):
                raise SettingError(f"a str, got {value!r} ({type(value).__name__})", key)
            return value
        if self.kind == "log":
            if not isinstance(value, Callable):
                raise SettingError(f"a function that takes a line (print, a logger's info) or None, got "
                                   f"{type(value).__name__}", key)
            return value
        if self.kind == "env":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise SettingError("a dict of environment variables' names to their values, both str", key)
            return dict(value)
        raise AssertionError(self.kind)

    def _number(self, value, key: str):
        whole_kind = self.kind == "whole"
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole_kind else numbers.Real):
            raise SettingError(f"must be {'a whole number' if whole_kind else 'a number'}, got {value!r}", key)
        value = int(value) if isinstance(value, numbers.Integral) else float(value)
        if not math.isfinite(value):
            raise SettingError(f"must be a finite number, got {value!r}", key)
        if self.low is not None and value < self.low:
            raise SettingError(f"must be at least {shown(self.low)}, got {shown(value)}", key)
        if self.high is not None and (value >= self.high if self.open_high else value > self.high):
            raise SettingError(f"must be {'below' if self.open_high else 'at most'} {shown(self.high)}"
                               f"{f' ({self.why})' if self.why else ''}, got {shown(value)}", key)
        if self.high is None and key in LIMITS:
            check_at_most(value, key)  # (its reason said)
        return value

    def highest(self, key: str) -> float | None:
        """Its upper bound: its own, else the key's in schema.LIMITS (with the reason there)."""
        return self.high if self.high is not None else LIMITS.get(key, (None,))[0]

    def click_type(self, key: str):
        """The command line's type for an option of this meaning: its choices, or the table's
        check of a number (`WholeOption`, `NumberOption`: click's ranges, so the help shows the
        bounds), so the option and the keyword refuse alike, in the same words."""
        if self.kind == "choice":
            return click.Choice(self.choices)
        if self.kind == "whole":
            return WholeOption(self, key)
        if self.kind == "number":
            return NumberOption(self, key)
        raise ValueError(f"no command-line type for a {self.kind} keyword")


class _Checked:
    """A command-line option's number, parsed and then checked by the keywords' table."""

    def __init__(self, entry: Keyword, key: str):
        self.entry, self.key = entry, key
        bounds = {"min": entry.low, "max": entry.highest(key)}
        super().__init__(**bounds, **({"max_open": entry.open_high} if entry.kind == "number" else {}))

    def convert(self, value, param, ctx):
        whole_kind = self.entry.kind == "whole"
        if isinstance(value, str):
            try:
                value = int(value) if whole_kind else float(value)
            except ValueError:
                self.fail(f"must be {'a whole number' if whole_kind else 'a number'}, got {value!r}", param, ctx)
        try:
            return self.entry.check(value, self.key)
        except SettingError as exc:
            self.fail(str(exc), param, ctx)


class WholeOption(_Checked, click.IntRange):
    pass


class NumberOption(_Checked, click.FloatRange):
    pass


def _search_modes() -> tuple[str, ...]:
    from catsdogs.measure.search import MODES

    return MODES


def _losses() -> tuple[str, ...]:
    from catsdogs.model_ref import LOSSES

    return LOSSES


# Every keyword of find_batch_size, profile, sweep, report and GradientNoiseScale that is not
# data or a model: what it takes. The command line's options of the same meaning take their types
# from here (`click_type`): --seed, --seeds, --epochs, --workers, --start, --max, --margin,
# --steps, --resolution, --warmup, --opt, --dataset, --precision, --mode, --loss, --runner.
KEYWORDS: dict[str, Keyword] = {
    **{k: Keyword("whole", 0) for k in ("seed", "warmup")},
    **{k: Keyword("whole", 1) for k in ("seeds", "epochs", "max_epochs", "eval_every", "workers", "start",
                                        "max_batch_size", "steps", "resolution", "race_workers",
                                        "effective_batch", "max_seeds", "every", "micro")},
    # a noise measurement's (catsdogs.keras.GradientNoiseScale): pairs at most MOST_PAIRS, each
    # holding a gradient's worth of numbers
    **{k: Keyword("whole", 2, MOST_PAIRS) for k in ("pairs", "micros")},
    "batch_size": Keyword("whole", 1),
    "margin": Keyword("number", 0, 1, open_high=True),
    "min_seconds": Keyword("number", 0),
    "race_budget": Keyword("number", 0, YEAR, why="a year"),  # (above 0: FindSettings.check says so)
    **{k: Keyword("flag") for k in ("noise_scale", "isolate", "deterministic", "race", "overwrite", "retry_failed",
                                    "dry_run", "tensorboard", "tf32")},
    "optimizer": Keyword("choice", choices=OPTIMIZERS),
    "dataset": Keyword("choice", choices=DATASETS),
    "precision": Keyword("choice", choices=PRECISIONS),
    **{k: Keyword("choice", choices=("local", "ray")) for k in ("runner", "race_runner")},
    **{k: Keyword("path") for k in ("out", "data_dir", "from_store", "export_store")},
    **{k: Keyword("text") for k in ("name", "note", "until", "ray_address")},
    "log": Keyword("log"),
    "worker_env": Keyword("env"),
    "find_results": Keyword("paths"),
}


def plain(value):
    """`value` with numpy's numbers and flags (in lists, tuples and dicts too) as Python's, so a
    caller's np.int64(2) is taken where 2 is."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:
        return plain(value.tolist())  # an array: a list
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if type(value).__module__ == "numpy":
        if isinstance(value, _np_bool()):
            return bool(value)
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
    return value


def keyword(key: str) -> Keyword:
    """The table's entry for `key`, the choices read where they are defined (the search's modes,
    the losses) for the two whose modules import this one."""
    if key == "mode":
        return Keyword("choice", choices=_search_modes())
    if key == "loss":
        return Keyword("choice", choices=_losses())
    return KEYWORDS[key]


def checked(values: dict) -> dict:
    """`values` with every key the table knows checked (`Keyword.check`), in their order: the
    first bad one a SettingError naming it. Keys the table does not know pass as they are."""
    return {k: keyword(k).check(v, k) if k in KEYWORDS or k in ("mode", "loss") else v
            for k, v in values.items()}


def memory_limit(value) -> int | None:
    """Bytes from an int, a float or a "4GiB"; a SettingError for anything else, or one not finite."""
    from catsdogs.measure.common import check_memory_limit, parse_memory

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise SettingError(f"a number of bytes or a size like '4GiB', got {type(value).__name__}", "memory_limit")
    if isinstance(value, str):
        return check_memory_limit(parse_memory(value))
    value = float(value) if not isinstance(value, numbers.Integral) else int(value)  # numpy's numbers too
    if not math.isfinite(value) or value < 1:
        raise SettingError(f"a positive, finite number of bytes, got {value!r}", "memory_limit")
    return check_memory_limit(int(value))


def flag(value, key: str) -> bool:
    """True or False (numpy's too); a SettingError naming `key` for anything else."""
    if not isinstance(value, (bool, _np_bool())):
        raise SettingError(f"True or False, got {value!r} ({type(value).__name__})", key)
    return bool(value)


def _np_bool() -> type:
    import numpy as np

    return np.bool_


MOST_BATCHES = 100_000  # a dataset read once has at most so many batches (a larger one is likely endless)


def keras_data(data) -> tuple | None:
    """(images, labels) as numpy arrays from data as Keras users hold it: a `tf.data.Dataset` of
    (images, labels), batched or not (what `keras.utils.image_dataset_from_directory` returns), or a
    `keras.utils.PyDataset`; read once, here, into the decoded copy the workers use, as arrays are.
    None for anything else. A SettingError naming `data` for one that cannot be read so: endless, or
    without labels."""
    import numpy as np

    module = type(data).__module__ or ""
    if module.startswith("tensorflow") and hasattr(data, "cardinality") and hasattr(data, "as_numpy_iterator"):
        import tensorflow as tf

        if int(data.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            raise SettingError("an endless tf.data.Dataset (repeat() with no count): give one that ends", "data")
        elements = data.as_numpy_iterator()
    elif "PyDataset" in {k.__name__ for k in type(data).__mro__}:
        count = data.num_batches
        if count is None:
            raise SettingError("an endless PyDataset (num_batches None): give one that ends", "data")
        elements = (data[i] for i in range(count))
    else:
        return None
    xs, ys = [], []
    for n, element in enumerate(elements):
        if n >= MOST_BATCHES:
            raise SettingError(f"a dataset of more than {MOST_BATCHES:,} elements: give a sample of it", "data")
        if not isinstance(element, (tuple, list)) or len(element) < 2:
            raise SettingError("a dataset of (images, labels): its elements hold no labels", "data")
        x, y = (np.asarray(v) for v in element[:2])
        xs.append(x if x.ndim == 4 else x[None])  # a batch, or one image
        ys.append(y if x.ndim == 4 else y[None])
    if not xs:
        raise SettingError("an empty dataset", "data")
    return np.concatenate(xs), np.concatenate(ys)
