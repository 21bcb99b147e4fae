"""What a worker keeps between tasks: the data sets it has decoded and the steps it has compiled.

A worker (catsdogs.runtime.worker, or a Ray actor) runs task after task; decoding the prepared
images and building, compiling and tracing the article's model are the costs it pays once:
- `DataCache`: every prepared data set it has decoded, checked against the manifest's
  fingerprint before each task, so data re-prepared under a worker is decoded again, never
  used stale;
- `StepCache`: the compiled training step (`TrainingStep`) of each trial shape it has run
  (`TrialConfig.shape()`: model, optimizer, batch size and protocol; not the seed, the data
  set or, without a warm-up, the learning rate), up to a memory budget. A trial of a known shape
  gets the weights a freshly built model of its seed has, zeroed optimizer state and its rate,
  so its result is bit-identical to the same trial in a fresh process (tests/training/test_engine.py),
  without building, compiling and tracing again.

One of each per process (`DATA`, `STEPS`). Imported only once the worker's backend has started
(catsdogs.runtime.backends: a framework reads its settings when it starts), so Keras is
imported here at the top.
"""

from __future__ import annotations

import gc
import os
import random
import zipfile
from collections import OrderedDict
from pathlib import Path

import keras
import numpy as np

from catsdogs.data import folder as folder_data
from catsdogs.data import loading
from catsdogs.errors import CatsdogsError
from catsdogs.manifest import require_prepared
from catsdogs.schema import TrialConfig, learning_rate
from catsdogs.training import user_model
from catsdogs.training.costs import OPTIMIZER_SLOTS, parameter_count
from catsdogs.training.model import build_model, loss_and_metrics

# The compiled steps a worker keeps: at most this share of the memory that holds them (the
# GPU's, else the host's). At 200 px one Adam step holds ~0.66 GB (weights, gradients, two
# slots), so a 24 GiB host keeps 9 of the article's 14 shapes.
STEP_CACHE_SHARE = 0.25
STEP_CACHE_BYTES_ENV = "CATSDOGS_STEP_CACHE_BYTES"  # overrides the share, in bytes (0: no cache)


class DataCache:
    """Decoded data sets by (folder, data set), each with the fingerprint it was decoded at."""

    def __init__(self):
        self._sets: dict[tuple[str, str], tuple[str, dict]] = {}
        self._folders: dict[tuple, tuple[str, loading.Split]] = {}  # a user's --data, by shape

    def load(self, data_dir: Path, dataset: str, expect: str = "",
             decoded: str | None = None) -> tuple[dict, dict[str, loading.Split]]:
        """(manifest, splits). `expect`: the fingerprint the task was planned on; data that
        changed since is an error, and data that changed since it was cached is decoded again.
        `decoded`: the data set decoded once by the parent (loading.save_decoded), read instead
        of the JPEGs where it holds their fingerprint (else, or where it is gone, they are decoded)."""
        manifest = require_prepared(Path(data_dir))
        fingerprint = manifest["fingerprint"][dataset]
        if expect and fingerprint != expect:
            raise CatsdogsError(f"the data in {data_dir} changed since this trial was planned "
                                "(re-prepared?): plan the sweep again")
        key = (str(Path(data_dir).resolve()), dataset)
        cached = self._sets.get(key)
        if cached is None or cached[0] != fingerprint:
            copied = _decoded_copy(decoded, fingerprint)
            if copied is not None:
                self._sets[key] = (fingerprint, copied)
                return manifest, copied
            self._sets[key] = (fingerprint, loading.load_dataset(Path(data_dir), dataset))
            # a file replaced mid-read: the fingerprint is checked once more after decoding
            if require_prepared(Path(data_dir))["fingerprint"][dataset] != fingerprint:
                del self._sets[key]
                raise CatsdogsError(f"the data in {data_dir} changed while it was being read")
        return manifest, self._sets[key][1]

    def load_folder(self, root: str, spec: list) -> loading.Split:
        """A user's image folder (--data) decoded at a model's input `spec` ([height, width,
        channels, classes, dtype]); decoded again when a file changed (folder.fingerprint). `root`
        may be the parent's decoded copy of it (folder_data.save_decoded), read as it is."""
        if root.endswith(folder_data.DECODED_SUFFIX):
            key = (root, *map(str, spec))
            stamp = str(Path(root).stat().st_mtime_ns)
            if key not in self._folders or self._folders[key][0] != stamp:
                self._folders[key] = (stamp, folder_data.load_decoded(Path(root), spec[4]))
            return self._folders[key][1]
        found = folder_data.scan(Path(root))
        stamp, key = folder_data.fingerprint(found), (str(found.root), *map(str, spec))
        cached = self._folders.get(key)
        if cached is None or cached[0] != stamp:
            height, width, channels, _, dtype = spec
            self._folders[key] = (stamp, folder_data.load(found, int(height), int(width), int(channels), dtype).split)
        return self._folders[key][1]


def _decoded_copy(path: str | None, fingerprint: str) -> dict[str, loading.Split] | None:
    """The splits of the parent's decoded copy at `path` when it holds `fingerprint`; else None."""
    if not path:
        return None
    try:
        copied, splits = loading.load_decoded(Path(path))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # gone (its run ended), or not its file
        return None
    return splits if copied == fingerprint else None


class TrainingStep:
    """A compiled model of one shape, and how to give it a new trial's starting state. `user`:
    a user's model and its loss ((catsdogs.model_ref reference, --loss); None: the article's)."""

    def __init__(self, cfg: TrialConfig, steps_per_epoch: int, backend, user: tuple[str, str] | None = None):
        self.shape = shape_of(cfg, steps_per_epoch, user)
        self.trial_shape = repr(cfg.shape())  # what a sweep knows of it (Worker.shapes)
        self.strategy = backend.distribution(cfg.strategy)
        self.user, self.backend = user, backend
        keras.mixed_precision.set_dtype_policy(cfg.precision)
        self._seed(cfg.seed)
        with self.strategy.scope():
            self.model = self._build(cfg)
            if user:
                loss, metrics = user_model.loss_and_metrics(user_model.choose_loss(self.model, user[1]))
            else:
                loss, metrics = loss_and_metrics()
            self.loss = loss  # what the noise scale differentiates for a user's model (engine.noise_estimate_at)
            self.model.compile(optimizer=make_optimizer(cfg, steps_per_epoch, backend), loss=loss, metrics=metrics)
            self.model.optimizer.build(self.model.trainable_variables)
            # the engine's collapse diagnosis reads the article's hidden layer; a user's model has none of its own
            self.inspect = None if user else inspection_model(self.model)
        self.compiled: dict = {}  # what the backend compiles for this step: the noise scale's Gram functions, `evaluate`
        # The optimizer's starting state: zeros (slots, iterations) but for a few scalars.
        self._opt_start = []
        for v in self.model.optimizer.variables:
            value = keras.ops.convert_to_numpy(v)
            self._opt_start.append(value if value.any() else None)
        self.nbytes = step_bytes(cfg, self.model.count_params() if user else None)

    def _seed(self, seed: int) -> None:
        """The article's model: the backend's seed, keeping every compiled function's kernels (its
        random ops are Keras's, stateless). A user's model may hold a layer that calls a stateful
        TensorFlow random op, whose stream only the kernel cache's clearing restarts:
        keras.utils.set_random_seed, as before 0.41.0."""
        if self.user is None:
            self.backend.seed(seed)
        else:
            keras.utils.set_random_seed(seed)

    def _build(self, cfg: TrialConfig):
        return user_model.build(self.user[0]) if self.user else build_model(cfg.image_size)

    def reset(self, cfg: TrialConfig) -> None:
        """The state a freshly built model of `cfg.seed` starts from: its weights (drawn as a
        new process draws them; a saved model's as saved), the optimizer's variables as built."""
        keras.mixed_precision.set_dtype_policy(cfg.precision)
        self._seed(cfg.seed)
        # every variable, a Dropout's seed state too (`weights` leaves it out: a reused step then
        # drew other masks than a fresh one)
        for target, value in zip(self.model.variables, INITIAL.values(self, cfg), strict=True):
            target.assign(value)
        for v, start in zip(self.model.optimizer.variables, self._opt_start, strict=True):
            v.assign(np.zeros(v.shape, v.dtype) if start is None else start)
        if not cfg.warmup_epochs:  # the rate is a variable, not in the shape (TrialConfig.shape)
            self.model.optimizer.learning_rate = learning_rate(cfg)


class InitialWeights:
    """The variables a freshly built model of a seed starts with, kept for the next trial of that
    seed. Every shape of a seed (optimizer, batch size, data set) starts from the same weights:
    building the model again for each is time a trial need not spend (at 200 px, 41 million
    numbers drawn; at 64 px 0.05 s a trial here). A sweep runs seed-major, but a race runs an arm
    at a time over up to 18 seeds (catsdogs.measure.race), so the seed changes at every trial: the
    most recently used seeds' are kept, within MOST_BYTES (at 64 px 15 seeds of 17 MB, enough for
    a rung's new seeds, 2, 4 and 12; at 128 px 3 of 67 MB, too few for them: a race there builds as
    before; at 200 px one of 164 MB, as before). Building draws from Python's and NumPy's global
    generators (Keras's default seeds): their states after the build are kept too, and put back, so
    what follows a reset draws as it would after a build."""

    MOST_BYTES = 256 * 2**20

    def __init__(self):
        self._kept: OrderedDict[tuple, tuple[list, tuple]] = OrderedDict()  # key -> (values, states), oldest first

    def values(self, step: TrainingStep, cfg: TrialConfig) -> list:
        """The initial variables of `step`'s model at `cfg.seed` (the random seeds already set)."""
        key = (step.user, cfg.image_size, cfg.precision, cfg.seed)
        kept = self._kept.get(key)
        if kept is None:
            fresh = step._build(cfg)
            kept = ([keras.ops.convert_to_numpy(v.value) for v in fresh.variables],
                    (random.getstate(), np.random.get_state()))
            del fresh
            size = sum(v.nbytes for v in kept[0])
            while self._kept and sum(v.nbytes for vs, _ in self._kept.values() for v in vs) + size > self.MOST_BYTES:
                self._kept.popitem(last=False)
            self._kept[key] = kept
        else:
            self._kept.move_to_end(key)
            random.setstate(kept[1][0])
            np.random.set_state(kept[1][1])
        return kept[0]


INITIAL = InitialWeights()  # one per process


def as_model_input(split: loading.Split, model) -> loading.Split:
    """The split as `model` takes it: the prepared uint8 images cast for a model of float input
    (0-255, as Keras's loaders give them); as they are for an integer input, the article's."""
    dtype = str(model.inputs[0].dtype)
    if "int" in dtype or str(split.images.dtype) == dtype:
        return split
    return loading.Split(split.images.astype(dtype), split.labels, split.files)


def inspection_model(model):
    """The trained model's hidden Dense(128) activations and its logit, from the same weights:
    what catsdogs.training.diagnosis reads a collapse from."""
    hidden = next(layer for layer in reversed(model.layers[:-1]) if isinstance(layer, keras.layers.Dense))
    return keras.Model(model.inputs, [hidden.output, model.outputs[0]], name="inspect")


def shape_of(cfg: TrialConfig, steps_per_epoch: int, user: tuple[str, str] | None = None) -> tuple:
    """The compiled step's identity; a warm-up schedule's length is compiled into it, and a
    user's model (with its loss) is another model than the article's."""
    shape = (*cfg.shape(), ("steps_per_epoch", steps_per_epoch if cfg.warmup_epochs else None))
    return (*shape, ("model", user)) if user else shape


def step_bytes(cfg: TrialConfig, parameters: int | None = None) -> int:
    """Memory a kept step holds: weights, gradients and the optimizer's slots, float32
    (`parameters`: a user's model's count; None: the article's at the trial's size)."""
    count = parameter_count(cfg.image_size) if parameters is None else parameters
    return 4 * count * (2 + OPTIMIZER_SLOTS[cfg.optimizer])


def make_optimizer(cfg: TrialConfig, steps_per_epoch: int, backend):
    lr = learning_rate(cfg)
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch / cfg.accumulate))
    if warmup > 0:
        lr = keras.optimizers.schedules.PolynomialDecay(  # a linear ramp 0 -> lr, then flat
            initial_learning_rate=lr / warmup, decay_steps=warmup, end_learning_rate=lr, power=1.0)
    kwargs = {"learning_rate": lr}
    if cfg.accumulate > 1:
        kwargs["gradient_accumulation_steps"] = cfg.accumulate
    return backend.optimizer_class(cfg.optimizer, cfg.strategy)(**kwargs)


class StepCache:
    """Compiled steps by shape, least recently used first out, within a byte budget."""

    def __init__(self):
        self._steps: OrderedDict[tuple, TrainingStep] = OrderedDict()
        self.budget: int | None = None

    def shapes(self) -> list[str]:
        """The trial shapes (`repr(TrialConfig.shape())`) whose steps are kept."""
        return [step.trial_shape for step in self._steps.values()]

    def get(self, cfg: TrialConfig, steps_per_epoch: int, backend, keep_others: bool = True,
            user: tuple[str, str] | None = None) -> tuple[TrainingStep, bool]:
        """(step, reused): the shape's kept step reset to `cfg`'s start, or a new one (`user`: a
        user's model, TrainingStep's)."""
        shape = shape_of(cfg, steps_per_epoch, user)
        step = self._steps.get(shape)
        if step is not None:
            self._steps.move_to_end(shape)
            step.reset(cfg)
            return step, True
        if not keep_others:
            self.clear()
        budget = self._budget(backend)
        while self._steps and sum(s.nbytes for s in self._steps.values()) + step_bytes(cfg) > budget:
            self._steps.popitem(last=False)
        step = TrainingStep(cfg, steps_per_epoch, backend, user)
        if step.nbytes <= budget:
            self._steps[shape] = step
        return step, False

    def clear(self) -> None:
        self._steps.clear()
        gc.collect()

    def _budget(self, backend) -> int:
        if self.budget is None:
            override = os.environ.get(STEP_CACHE_BYTES_ENV)
            if override is not None:
                self.budget = int(override)
            else:
                total = backend.memory_budget_bytes()
                self.budget = int(STEP_CACHE_SHARE * total) if total else 0
        return self.budget


# One of each per process: a worker's memory of what it has done.
DATA = DataCache()
STEPS = StepCache()
