"""The Python API's inputs checked and read before any work, as the command line's options are
parsed: whole numbers and flags (numpy's taken), a memory limit, and data as Keras users hold it
(a `tf.data.Dataset`, a `keras.utils.PyDataset`) read into arrays. Each refusal a SettingError
naming the keyword."""

from __future__ import annotations

import math
import numbers

from catsdogs.errors import SettingError


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


def whole(value, key: str) -> int | None:
    """A whole number given as Python's or numpy's int, as an int (None stays None); a SettingError
    naming `key` for anything else (a bool, a float, a string): the options' types, as the command
    line parses them."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SettingError(f"a whole number, got {value!r} ({type(value).__name__})", key)
    return int(value)


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
