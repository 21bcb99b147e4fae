"""TensorBoard from the store: every trial of a sweep as a TensorBoard run, in the HParams
dashboard's format (issue 36).

`export(trials, folder)` writes, under `folder` (report: OUT/NAME/tensorboard/), one run per
trial (`run_name`: its optimizer, batch size, data set, seed and key) holding
- the HParams plugin's session start (its hyperparameters, `HPARAMS`) and end (its status:
  done is a success, failed / oom / lost / interrupted a failure, pending and running running;
  a trial is never left out for its status),
- its per-epoch scalars (`EPOCH_SCALARS`, as `epoch/NAME`, step = the epoch), its validation
  curve where `--eval-every` recorded one (`curve/val_loss`, `curve/val_accuracy`, step = the
  training images seen), and its final metrics (`METRICS`, step = its last epoch), which the
  dashboard's metric columns read,
and, in `folder` itself, the experiment: every hyperparameter with its type and values, and every
metric. TensorBoard then shows the sweep in its HParams table and parallel coordinates:

    tensorboard --logdir OUT/NAME/tensorboard

A run is written again only when its trial changed: each run holds the digest of the row it was
written from (`STAMP`), so a second export of an unchanged store writes no event file. A run is
written into a temporary folder beside it and put in place whole, so a reader never takes a
half-written run for a finished one.

Written with the `tensorboard` package's own event writer and protocol buffers (the extra
catsdogs[tensorboard]); its `hparams` summary helpers import TensorFlow, so the plugin's messages
are built here from its protocol buffers, which do not. Reads only the rows it is given (the
store's: catsdogs.analysis.rows.load_trials); imports no framework.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import types
import uuid
from pathlib import Path

from catsdogs.analysis.rows import field, load_trials
from catsdogs.errors import CatsdogsError
from catsdogs.store import store_path

# The hyperparameters, as the HParams table shows them: (the row's field, its kind).
HPARAMS = (("optimizer", str), ("batch_size", float), ("dataset", str), ("learning_rate", float),
           ("lr_scaling", str), ("warmup_epochs", float), ("budget", str), ("accumulate", float),
           ("precision", str), ("seed", float), ("backend", str), ("deterministic", bool),
           ("epochs", float), ("until", str), ("eval_every", float))  # a target's trials differ by these
# A trial's final metrics (the table's metric columns), each a scalar of its own tag.
METRICS = ("test_accuracy", "test_loss", "train_seconds", "images_per_second", "collapsed", "steps_to_target")
# Per epoch, from the trial's history: tagged epoch/NAME.
EPOCH_SCALARS = ("loss", "accuracy", "val_loss", "val_accuracy", "noise_scale")
# The validation curve of --eval-every, where recorded: tagged curve/NAME, step = training images seen.
CURVE_SCALARS = ("val_loss", "val_accuracy")
STAMP = "catsdogs-trial.sha256"  # in each run: the digest of the row it was written from
EXPERIMENT = "experiment"  # the experiment's run (a folder of its own, beside the trials')
LOCK = ".catsdogs-export.lock"  # in the folder: one export at a time
HINT = "TensorBoard export needs the tensorboard package: pip install 'catsdogs[tensorboard]'"


def _tb():
    """The tensorboard package's writer and protocol buffers, or the one-line hint.

    TensorBoard's event writer reaches files through `tensorboard.compat.tf`, which imports
    TensorFlow where it is installed (seconds, and a framework in a process that has none). Its
    own marker `tensorboard.compat.notf` (what its no-TensorFlow build ships) makes it take its
    stub instead, which writes local files the same; set here unless TensorFlow is loaded already."""
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise CatsdogsError(HINT) from None
    return event_pb2, summary_pb2, api_pb2, metadata, plugin_data_pb2, EventFileWriter


def run_name(trial: dict) -> str:
    """A trial's run: readable, and stable for as long as the trial is the same trial (its key)."""
    return (f"{field(trial, 'optimizer')}_b{field(trial, 'batch_size')}_{field(trial, 'dataset')}"
            f"_s{field(trial, 'seed')}_{str(trial['key'])[:10]}")


def hparams_of(trial: dict) -> dict:
    """The trial's hyperparameters by HPARAMS (those it has)."""
    out = {}
    for name, kind in HPARAMS:
        value = field(trial, name)
        if value is None and name == "learning_rate":  # not trained yet: the rate it was given, if any
            value = field(trial, "lr")
        if value is not None:
            out[name] = kind(value)
    return out


EXPORT_FORMAT = 2  # what a run holds: 2 added epochs, until, eval_every and steps_to_target (0.18.0)


def digest(trial: dict) -> str:
    """The stamp of a run: its trial's row, and the format it was written in (a run of an older
    format is written again, so it gains what the format added)."""
    blob = json.dumps({"trial": trial, "format": EXPORT_FORMAT}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def export(trials: list[dict], folder: Path) -> dict:
    """Write the sweep's runs under `folder`; {"written", "unchanged", "runs"} (see the module).
    One export of a folder at a time, across processes (two reports, or a report beside a sweep,
    each wait for the other's lock), so a run never holds two exports' event files."""
    tb = _tb()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(folder / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, or when the process dies
        for stale in [*folder.glob(".*.tmp"), *folder.glob(".*.old")]:  # an export killed mid-way
            shutil.rmtree(stale, ignore_errors=True)  # (none is live: the lock is ours)
        for trial in trials:
            run = folder / run_name(trial)
            stamp = digest(trial)
            if _current(run, stamp):
                continue
            _replace(run, lambda tmp, t=trial, s=stamp: _write_trial(tb, tmp, t, s))
            written += 1
        if written or not (folder / EXPERIMENT).is_dir():
            _replace(folder / EXPERIMENT, lambda tmp: _write_experiment(tb, tmp, trials))
    return {"written": written, "unchanged": len(trials) - written, "runs": len(trials)}


def _current(run: Path, stamp: str) -> bool:
    """Whether `run` holds the trial of digest `stamp`, whole: its stamp and one event file (two,
    left by concurrent exports of 0.17.0 and earlier, logged the session twice: written again)."""
    return ((run / STAMP).is_file() and (run / STAMP).read_text() == stamp
            and len(list(run.glob("events.out.tfevents.*"))) == 1)


def check_installed() -> None:
    """The one-line hint (a CatsdogsError) when the tensorboard package is missing."""
    _tb()


def export_trials(trials: list[dict], folder: Path, log=print) -> Path:
    """`export`, then one line: what it wrote, and where TensorBoard reads it."""
    result = export(trials, folder)
    log(f"TensorBoard: {result['runs']} trials, {result['written']} written, {result['unchanged']} unchanged, "
        f"in {folder} (tensorboard --logdir {folder})")
    return Path(folder)


def live(enabled: bool, out: Path, name: str, log=print):
    """`sweep --tensorboard`: a callable (None unless `enabled`) that exports sweep `name` of the
    store in `out` to OUT/NAME/tensorboard/ again, each time a trial's outcome is stored; only the
    trials that changed are written, so each call costs little. Checks for the package first. One
    export at a time: the sweep's slots call it from their threads."""
    if not enabled:
        return None
    check_installed()
    lock, folder = threading.Lock(), Path(out) / name / "tensorboard"

    def on_finished() -> None:
        # a side output: its failure is said and the sweep goes on (the report exports it again)
        with lock:
            try:
                export_trials(load_trials(store_path(out), name), folder, log)
            except (CatsdogsError, OSError) as exc:
                log(f"Warning: TensorBoard export to {folder} failed ({exc}); the sweep goes on: "
                    f"`catsdogs report --out {out} --name {name} --tensorboard` exports it again")

    return on_finished


def _replace(target: Path, write) -> None:
    """`write(tmp)` into a fresh folder beside `target`, then put it in target's place."""
    unique = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this process's own, whatever else writes
    tmp, old = target.with_name(f".{target.name}.{unique}.tmp"), target.with_name(f".{target.name}.{unique}.old")
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        if target.exists():
            target.rename(old)
        try:
            tmp.rename(target)
        except OSError:
            if old.exists():  # the run as it was, rather than none
                old.rename(target)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _write_trial(tb, folder: Path, trial: dict, stamp: str) -> None:
    event_pb2, summary_pb2, api_pb2, metadata, plugin_data_pb2, EventFileWriter = tb
    writer = EventFileWriter(str(folder))
    now = time.time()

    def emit(step: int, *values) -> None:
        writer.add_event(event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=list(values))))

    def scalar(tag: str, value) -> object:
        return summary_pb2.Summary.Value(tag=tag, simple_value=float(value))

    start = plugin_data_pb2.SessionStartInfo(group_name=run_name(trial), start_time_secs=now)
    for name, value in hparams_of(trial).items():
        hp = start.hparams[name]
        if isinstance(value, bool):
            hp.bool_value = value
        elif isinstance(value, float):
            hp.number_value = value
        else:
            hp.string_value = value
    emit(0, _plugin_value(tb, metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)))
    history = trial.get("history") or []
    for epoch, row in enumerate(history, start=1):
        values = [scalar(f"epoch/{k}", row[k]) for k in EPOCH_SCALARS if row.get(k) is not None]
        if values:
            emit(epoch, *values)
    for point in trial.get("curve") or []:  # --eval-every's validation curve, by training images seen
        emit(int(point["examples"]), *(scalar(f"curve/{k}", point[k]) for k in CURVE_SCALARS if point.get(k) is not None))
    finals = [scalar(k, trial[k]) for k in METRICS if trial.get(k) is not None]
    if finals:
        emit(len(history), *finals)
    status = {"done": api_pb2.STATUS_SUCCESS, "pending": api_pb2.STATUS_RUNNING,
              "running": api_pb2.STATUS_RUNNING}.get(str(trial.get("status")), api_pb2.STATUS_FAILURE)
    end = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=now)
    emit(len(history), _plugin_value(tb, metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)))
    writer.close()
    (folder / STAMP).write_text(stamp)


def _write_experiment(tb, folder: Path, trials: list[dict]) -> None:
    event_pb2, summary_pb2, api_pb2, metadata, plugin_data_pb2, EventFileWriter = tb
    infos = []
    values = [hparams_of(t) for t in trials]
    for name, kind in HPARAMS:
        seen = sorted({v[name] for v in values if name in v}, key=str)
        if not seen:
            continue
        info = api_pb2.HParamInfo(name=name, type={str: api_pb2.DATA_TYPE_STRING, bool: api_pb2.DATA_TYPE_BOOL,
                                                   float: api_pb2.DATA_TYPE_FLOAT64}[kind])
        if kind is str:
            info.domain_discrete.extend(seen)
        infos.append(info)
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in
               (*METRICS, *(f"epoch/{k}" for k in EPOCH_SCALARS), *(f"curve/{k}" for k in CURVE_SCALARS))]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics, time_created_secs=time.time())
    writer = EventFileWriter(str(folder))
    value = _plugin_value(tb, metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary_pb2.Summary(value=[value])))
    writer.close()


def _plugin_value(tb, tag: str, data):
    """A summary value of the HParams plugin: its metadata holds the message, its tensor is empty."""
    _, summary_pb2, _, metadata, _, _ = tb
    return summary_pb2.Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data),
                                     tensor=metadata.NULL_TENSOR)
