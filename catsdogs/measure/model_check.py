"""A user's model (--model) before the probes: built and checked in a worker of its own, and the
data its probes run on. Framework-free, as profile's and find-batch-size's own processes are.

`check_user_model` runs catsdogs.training.user_model in a worker no probe runs in (so what
building the model allocated never counts in a probe's peak) and returns what it found: input
shape, classes, parameters and the loss it will train with. A model that cannot be imported,
built or used is a SettingError naming the option (`--model`, or `--loss`): a usage error, exit 2.

`data_for` decides what the probes train on: the user's images (--data DIR, one subfolder per
class: catsdogs.data.folder), else the prepared data where the model takes their images (size x
size x 3), else random images of the model's input shape and labels of its classes. Memory and
speed do not depend on what the pixels show, so they need no real data; the output says which it
used. A folder is decoded once, here, to check it (every file, its classes against the model's);
the decoded images are saved in the run's work folder, and each worker reads that copy, so no
probe's memory holds the decoder's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catsdogs import model_ref
from catsdogs.data import folder as folder_data
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.manifest import load_manifest, require_intact
from catsdogs.messages import ModelCheckTask, ModelInfo
from catsdogs.model_ref import RACE_SPLIT, check_loss, is_file, parse
from catsdogs.runtime.worker import Worker, run_isolated
from catsdogs.schema import Status

_OPTION = re.compile(r"^(?:CatsdogsError: )?--(model|loss) (\S+): ")


def check_options(model: str | None, loss: str, images: Path | None, precision: str) -> None:
    """A SettingError for options that go only with --model, or not with it as given."""
    if model is None:
        if images is not None:
            raise SettingError("a folder of images for your own model: give --model too "
                               "(the article's model trains on the prepared data)", "data")
        if check_loss(loss) != "auto":
            raise SettingError("the loss of your own model: give --model too (the article's is binary "
                               "cross-entropy from logits)", "loss")
        return
    if is_file(parse(model)) and precision != "float32":
        raise SettingError(f"a saved model keeps the precision it was saved with, so --precision {precision} "
                           "would not reach it: use float32, or a function that builds it (--model "
                           "package.module:function builds it under the policy)", "precision")


def check_user_model(model: str, loss: str, log_path: Path, env: dict | None,
                     worker: Worker | None = None) -> tuple[str, ModelInfo]:
    """(the canonical reference, what the worker found, with the reference's `source` as it was
    when checked), or a SettingError of one line for a model that cannot be used; a worker that
    failed for another reason (it died, ran out of memory) is a CatsdogsError. In a fresh worker
    that ends with the check, or in `worker`, left to its owner (find-batch-size's noise scale
    trains next in it: a worker's start fewer; no probe's memory is measured there)."""
    ref, loss = parse(model), check_loss(loss)
    source = model_ref.source(ref)  # before any worker reads it
    if worker is None:
        record: ModelInfo = run_isolated(ModelCheckTask(ref, loss), log_path, env)
    else:
        record, log_path = worker.run(ModelCheckTask(ref, loss)), worker.log_path
    if record.status == Status.DONE:
        if worker is None:
            log_path.unlink(missing_ok=True)
        record.source = source
        return ref, record
    line = (record.error or "the worker ended without a word").strip().splitlines()[0]
    said = _OPTION.match(line)
    if said:
        raise SettingError(f"{said.group(2)}: {line[said.end():]}", said.group(1))
    raise CatsdogsError(f"checking --model {model}: {record.status}: {line} (log: {log_path})")


def recorded(info: ModelInfo) -> dict:
    """The model as profile.json and find_batch_size.json record it."""
    return {**(info.source or {}), **{k: v for k, v in info.as_dict().items()
                                      if k not in ("status", "error", "traceback", "source")}}


def identity(info: ModelInfo) -> str:
    """What a user's model's trials are keyed by (TrialConfig.model: model_ref.trial_model)."""
    return model_ref.trial_model(info.source or {}, info.name, info.architecture)


@dataclass(frozen=True)
class ProbeData:
    """What a user's model's probes run on, and the sentence that says so."""

    manifest: dict | None  # the prepared data's, when the probes run on them
    input_spec: list | None  # [height, width, channels, classes, dtype] of the model (None: the prepared data)
    folder: str | None  # --data: the user's images (None, with an input_spec: random images)
    said: str
    count: int | None = None  # the folder's images that decode
    undecodable: int | None = None
    undecodable_files: list | None = None  # their names, relative to the folder
    decoded: str | None = None  # the folder decoded once, the file the workers read (folder_data.save_decoded)
    arrays: str | None = None  # the Python API's numpy arrays instead of a folder: their digest
    fingerprint: str | None = None  # the folder's (folder_data.fingerprint) or the arrays' digest: what the race keys by
    classes: int | None = None  # the classes its images hold (a folder's subfolders, the arrays' labels)

    @property
    def own(self) -> bool:
        """The user's own images (a folder, or numpy arrays), split by `folder_data.holdout`."""
        return bool(self.folder or self.arrays)

    @property
    def real(self) -> bool:
        """Real images (the user's, or the prepared data), not random ones: what the noise scale needs."""
        return bool(self.own or self.manifest)

    def task_fields(self) -> dict:
        """The probes' (ProbeTask) fields."""
        folder = self.decoded or self.folder  # (absolute: a Ray actor's working folder is not this one's)
        return {"input_spec": self.input_spec, "data_folder": str(Path(folder).resolve()) if folder else None}

    def record(self) -> dict:
        return {"input_spec": self.input_spec, "data_folder": self.folder, "image_count": self.count,
                "undecodable": self.undecodable, "undecodable_files": self.undecodable_files,
                "random_images": bool(self.input_spec and not self.own),
                **({"data_arrays": self.arrays} if self.arrays else {})}


def data_for(info: ModelInfo, data_dir: Path, folder: Path | None = None, work: Path | None = None,
             arrays: tuple | None = None) -> ProbeData:
    """The folder's images (--data), checked and decoded once here: its classes against the
    model's, and every file, so a folder the probes cannot use is one line before any probe (and,
    with `work`, the decoded images saved there for the workers: no probe decodes, so no probe's
    memory holds the decoder's); or the Python API's numpy `arrays` (x, y), checked against the
    model and saved there alike; else the prepared data when they are the model's input; else
    random images."""
    height, width, channels = info.input_shape
    spec = [height, width, channels, info.classes, info.input_dtype]
    if arrays is not None:
        split = folder_data.from_arrays(*arrays, shape=(height, width, channels), classes=info.classes)
        digest = folder_data.digest(split)
        decoded = (folder_data.save_decoded_copy(split, work, f"arrays-{digest}", info.input_shape)
                   if work is not None else None)
        k = len(np.unique(split.labels))
        return ProbeData(None, spec, None, f"{len(split):,} images of {k} classes (numpy arrays, {split.images.dtype}), "
                         f"{height} x {width}", len(split), 0, [], decoded, digest, digest, k)
    if folder is not None:
        found = folder_data.scan(folder)
        if len(found.classes) > info.classes:
            raise SettingError(f"{folder} holds {len(found.classes)} classes, more than the model's "
                               f"{info.classes} ({info.loss_description})", "data")
        loaded = folder_data.load(found, height, width, channels)  # uint8: the workers cast for their model
        fingerprint = folder_data.fingerprint(found)
        decoded = (folder_data.save_decoded_copy(loaded.split, work, fingerprint, info.input_shape)
                   if work is not None else None)
        n = len(loaded.undecodable)
        left = (f"; {n} file{'s' if n != 1 else ''} that did not decode left out ({', '.join(loaded.undecodable[:3])}"
                f"{', ...' if n > 3 else ''}: every name in the JSON)") if n else ""
        return ProbeData(None, spec, str(found.root), f"{len(loaded.split):,} images of {len(found.classes)} classes "
                         f"({', '.join(found.classes)}) in {found.root}, resized to {height} x {width}{left}",
                         len(loaded.split), len(loaded.undecodable), list(loaded.undecodable), decoded,
                         fingerprint=fingerprint, classes=len(found.classes))
    manifest = load_manifest(Path(data_dir))
    size = manifest["params"]["size"] if manifest else None
    if manifest and (height, width, channels) == (size, size, 3):
        require_intact(Path(data_dir))
        return ProbeData(manifest, None, None, f"the prepared data in {data_dir} ({size} px)")
    why = (f"the prepared data are {size} x {size} x 3" if manifest else f"no prepared data in {data_dir}")
    return ProbeData(None, spec, None, f"random images {height} x {width} x {channels} ({info.input_dtype}) and "
                     f"labels of {info.classes} classes ({why}; memory and speed do not depend on what the "
                     "images show)")


def _mega(flops: float) -> str:
    """Millions, readable at any size: 1,234.6, 12.3, 0.0456 (a small model's is no "0.0")."""
    m = flops / 1e6
    return f"{m:,.1f}" if m >= 1 else f"{m:.3g}"


def describe(info: ModelInfo) -> str:
    """One line: the model, its size and its loss."""
    flops = (f"{_mega(info.train_flops_per_image)} MFLOPs an image a training step" if info.train_flops_per_image
             else f"FLOPs not counted (layers {', '.join(info.flops_unknown or [])}: no MFU)")
    return (f"model {info.name}: {info.parameters:,} parameters, {info.layers} layers, input "
            f"{' x '.join(map(str, info.input_shape))}, {flops}; {info.loss_description}")


def user_task(settings, probe_data: ProbeData | None) -> dict | None:
    """A user's model as a trial trains it (messages.TrialTask.user); None for the article's.
    `settings`: find-batch-size's (FindSettings)."""
    if settings.model is None:
        return None
    return {"model": settings.model, "loss": settings.loss, **(probe_data.task_fields() if probe_data else {})}


@dataclass(frozen=True)
class Raced:
    """The model and data a race trains (catsdogs.measure.race_run): the article's model on the
    prepared data, or a user's on the prepared data or on its own images, there with a tenth of
    the training images held out to validate (the target is on a validation split a folder lacks:
    folder_data.race_splits)."""

    model: str | None  # TrialConfig.model (`identity`); None: the article's
    task: dict | None  # messages.TrialTask.user; None: the article's
    data: str  # TrialConfig.data: the prepared data's fingerprint, or the user's images', "+validation"
    train_images: int  # what each trial trains on
    classes: int = 2  # the data's classes, at most the model's: chance's loss is ln(classes)

    @classmethod
    def of(cls, settings, manifest: dict | None, info: ModelInfo | None, probe_data: ProbeData | None) -> Raced:
        """`settings`: find-batch-size's; `manifest`: the prepared data's (None: the user's images)."""
        task = user_task(settings, probe_data)
        if task is None or manifest is not None:
            counts = manifest["counts"][settings.dataset]["train"].values()
            return cls(task and identity(info), task, manifest["fingerprint"][settings.dataset], sum(counts),
                       2)  # (cats and dogs)
        if probe_data is None or not probe_data.own:
            raise SettingError("races on real images (its target is a validation loss, and random images carry "
                               "nothing to learn): give --data DIR, or prepared data your model takes", "race")
        images = probe_data.folder or f"numpy arrays {probe_data.arrays}"  # (what the sweep records)
        return cls(identity(info), {**task, "validation": True, "images": images}, probe_data.fingerprint + RACE_SPLIT,
                   folder_data.race_train_count(probe_data.count), min(info.classes, probe_data.classes or info.classes))

