"""catsdogs from Python: the commands as functions a training script or a notebook calls.

    import catsdogs
    advice = catsdogs.find_batch_size(model, (x, y), memory_limit="4GiB")
    model.fit(x, y, batch_size=advice.batch_size)

Each function does what its command does, with the command's defaults (one default per setting:
`FindSettings` and the plans hold them), writes the same files under `out`, and returns what the
command prints as a value. A setting no run can use, data that cannot be trained on, a model
that cannot be used: a `CatsdogsError` (`SettingError` for a setting, which names the keyword
argument) of one line, raised before anything is written; nothing calls `sys.exit`.

A model travels to the worker processes that measure it (every probe runs in one, so an
out-of-memory ends a worker, never the caller) as the CLI's `--model` does: a path to a
`.keras` file, or "package.module:function". A live `keras.Model` is saved once to a `.keras`
file in the run's work folder and deleted after (its SHA-256 recorded): custom layers must be
registered (`@keras.saving.register_keras_serializable()`) to load there. A function is named by
its module where the workers can import it (a module under the working directory or installed),
else called once here and its model saved alike. Numpy arrays travel as the decoded copy a
folder is decoded to (catsdogs.data.folder.from_arrays): exactly the pixels given.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from catsdogs import config
from catsdogs.advice import BatchSizeAdvice
from catsdogs.errors import CatsdogsError, SettingError, os_error_line
from catsdogs.keywords import checked, keras_data, plain
from catsdogs.keywords import memory_limit as memory_limit_bytes
from catsdogs.model_ref import FUNCTION
from catsdogs.schema import PROCESS_FIELDS, check_run_name

__all__ = ["BatchSizeAdvice", "CatsdogsError", "SettingError", "close", "find_batch_size", "profile", "report", "sweep"]

# the command line's option -> the keyword argument that sets it here, for an error's first word
# (a key not here is its keyword's own name: data, model, seed ...)
_KEYWORDS = {"opt": "optimizer", "max": "max_batch_size", "batch_size": "batch_sizes"}


# A plan's top-level keys a sweep's caller may override (the command line's options of them too);
# the rest of a plan's top level describes it, and `epochs` is a grid's.
PLAN_OVERRIDES = ("seeds", "name", "target_ci", "max_seeds", "noise_scale", "eval_every", "max_epochs",
                  *PROCESS_FIELDS)
SEARCH = ("mode", "start", "margin", "steps", "resolution", "dataset", "isolate", "deterministic", "tf32", "worker_env",
          "effective_batch", "race", "race_budget", "until", "race_workers", "race_runner", "ray_address")


def _keyword_errors(function):
    """The function with a SettingError's message begun with the keyword argument it names, as the
    CLI begins it with the option ("max_batch_size: --max 4 is below --start 8 ..."), and the
    filesystem's errors one line of CatsdogsError naming the path, as the CLI says them (an `out`
    that is a file, a name too long for the filesystem, a full disk)."""

    @functools.wraps(function)
    def said(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SettingError as exc:
            if not exc.key:
                raise
            keyword = exc.key if exc.key in kwargs else _KEYWORDS.get(exc.key, exc.key)  # (sweep's batch_size is its own)
            text = str(exc)
            named = text.startswith(f"{keyword}:") or f" {keyword}:" in text  # ("sweep(): epochs: ...")
            raise SettingError(text if named else f"{keyword}: {text}", exc.key) from None
        except OSError as exc:
            raise CatsdogsError(os_error_line(exc)) from None
        finally:
            close()  # the call's worker templates let go: the caller's process keeps none between calls

    return said


def close() -> None:
    """Let go of every process catsdogs holds between calls in this Python process (the worker
    templates a call on TensorFlow starts, about 0.6-0.8 GiB each); each public function does it as
    it returns, so this is for a caller that used catsdogs's internals."""
    template = sys.modules.get("catsdogs.runtime.template")  # none started where it was never imported
    if template is not None:
        template.release_all()


@_keyword_errors
def find_batch_size(model=None, data=None, *, memory_limit: int | str | None = None, optimizer: str = "adam",
                    max_batch_size: int | None = None, seed: int = 0, precision: str = "float32",
                    noise_scale: bool = True, loss: str = "auto", from_store: str | Path | None = None,
                    name: str = "find-batch-size", out: str | Path = config.DEFAULT_OUT,
                    data_dir: str | Path | None = None, log: Callable[[str], None] | None = print,
                    **search: object) -> BatchSizeAdvice:
    """The largest batch size that fits, the fastest, the gradient noise scale and the batch size
    to train with: `catsdogs find-batch-size`, returning its answer (also written to
    OUT/NAME/find_batch_size.json).

    model: a `keras.Model`, a function that builds one, a PATH.keras or "module:function"; None:
        the article's model on the prepared data (`data_dir`).
    data: a folder of class subfolders, or numpy arrays `(x, y)` (x of the model's input shape,
        y class indices); None: the prepared data where they are the model's input, else random
        images (memory and speed only: the noise scale needs real images).
    memory_limit: bytes, or "4GiB"; None: a GPU's memory, on the CPU 90% of what is available.
    search: the command's other settings by FindSettings' names (mode, start, margin, steps,
        resolution, dataset, isolate, deterministic, tf32, worker_env; effective_batch: a batch to
        keep, whose gradient-accumulation plan the advice gives; race=True: the sizes that fit
        raced to a target, the advice's batch_size then the measured fastest, with race_budget
        (seconds), until ("val_loss=0.49"; default: a reference run's), race_workers, and
        race_runner="ray" with ray_address for Ray's actors; a model of yours races on `data` with
        a tenth of its training images held out to validate).
    log: where the progress lines go (None: nowhere).

    Example:
        >>> advice = catsdogs.find_batch_size(model, (x_train, y_train), memory_limit="2GiB")
        >>> advice.batch_size, advice.learning_rate
    """
    return BatchSizeAdvice.of(find_result(
        model, data, memory_limit=memory_limit, optimizer=optimizer, max_batch_size=max_batch_size, seed=seed,
        precision=precision, noise_scale=noise_scale, loss=loss, from_store=from_store, name=name, out=out,
        data_dir=data_dir, log=log, **search))


def find_result(model=None, data=None, *, memory_limit: int | str | None = None, optimizer: str = "adam",
                max_batch_size: int | None = None, seed: int = 0, precision: str = "float32",
                noise_scale: bool = True, loss: str = "auto", from_store: str | Path | None = None,
                name: str = "find-batch-size", out: str | Path = config.DEFAULT_OUT,
                data_dir: str | Path | None = None, log: Callable[[str], None] | None = print,
                **search: object):
    """find-batch-size's one core, for the command line and `find_batch_size` alike: the options
    made into FindSettings (`find_settings`), the model made ready for the workers, the search run;
    its result (catsdogs.find_result.FindResult). A SettingError names its setting by its key: the
    command line says it by the option, `find_batch_size` by the keyword argument."""
    from catsdogs.measure.find_batch_size import find_batch_size as run

    log = checked({"out": out, "log": log})["log"]  # (find_settings checks the rest)
    settings, data_dir, arrays = find_settings(
        model, data, memory_limit=memory_limit, optimizer=optimizer, max_batch_size=max_batch_size, seed=seed,
        precision=precision, noise_scale=noise_scale, loss=loss, from_store=from_store, name=name,
        data_dir=data_dir, search=search)
    ref, saved = _model_reference(model, Path(out) / name / ".work", precision)
    try:
        return run(replace(settings, model=ref), data_dir, Path(out), log=log or _quiet, arrays=arrays)
    finally:
        if saved is not None:
            saved.unlink(missing_ok=True)


def find_settings(model, data, *, memory_limit, optimizer, max_batch_size, seed, precision, noise_scale, loss,
                  from_store, name, data_dir, search: dict):
    """(find-batch-size's settings, checked, its data folder, a user's arrays or None): the one way
    its options become FindSettings (`search`: FindSettings' other names, the SEARCH keys)."""
    from catsdogs.measure.settings import FindSettings

    unknown = sorted(set(search) - set(SEARCH))
    if unknown:
        raise TypeError(f"find_batch_size() got unexpected keyword arguments: {', '.join(unknown)}")
    given = checked({"optimizer": optimizer, "max_batch_size": max_batch_size, "seed": seed, "precision": precision,
                     "noise_scale": noise_scale, "loss": loss, "from_store": from_store, "name": name,
                     "data_dir": data_dir, **search})  # (the table's types and bounds; FindSettings.check the rest)
    max_batch_size, seed, noise_scale = given["max_batch_size"], given["seed"], given["noise_scale"]
    search = {k: given[k] for k in search}
    check_run_name(name)  # it names a folder under `out`
    cap = memory_limit_bytes(memory_limit)  # (before the data are read: a dataset is read whole)
    data_dir = Path(data_dir) if data_dir is not None else config.default_data_dir()
    images, arrays = _data(data, model)
    settings = FindSettings(name=name, optimizer=optimizer, max_batch=max_batch_size, seed=seed, precision=precision,
                            measure_noise=bool(noise_scale), loss=loss, images=images,
                            memory_cap_bytes=cap, **search)
    if max_batch_size is not None and "start" not in search:  # max alone: the search starts no higher
        settings = replace(settings, start=min(settings.start, max_batch_size))
    if from_store is not None:
        from catsdogs.analysis.anchor import anchor_for

        settings = replace(settings, anchor=anchor_for(Path(from_store), optimizer, settings.dataset, data_dir))
    settings.check(model_given=model is not None)
    return settings, data_dir, arrays


@_keyword_errors
def profile(model=None, batch_sizes: Sequence[int] = (4, 8, 16, 32, 64, 128, 256, 512, 1024), data=None, *,
            memory_limit: int | str | None = None, optimizer: str = "adam", precision: str = "float32",
            steps: int = 20, warmup: int = 2, loss: str = "auto", name: str = "profile",
            out: str | Path = config.DEFAULT_OUT, data_dir: str | Path | None = None,
            log: Callable[[str], None] | None = print, **probe: object) -> list[dict]:
    """Throughput, memory and utilization at each batch size: `catsdogs profile`, returning its rows
    (OUT/NAME/profile.csv's, one a batch size, in the order given). `model` and `data` as for
    `find_batch_size` (a folder, numpy arrays, a tf.data.Dataset or a PyDataset); `probe`: the command's other settings (dataset,
    min_seconds, isolate, deterministic, tf32, worker_env).

    Example:
        >>> rows = catsdogs.profile(model, [16, 64, 256], memory_limit="2GiB")
        >>> [(r["batch_size"], r["images_per_second"]) for r in rows]
    """
    from catsdogs.measure.profile import profile as run

    unknown = sorted(set(probe) - {"dataset", "min_seconds", "isolate", "deterministic", "tf32", "worker_env"})
    if unknown:
        raise TypeError(f"profile() got unexpected keyword arguments: {', '.join(unknown)}")
    given = checked({"optimizer": optimizer, "precision": precision, "steps": steps, "warmup": warmup, "loss": loss,
                     "name": name, "out": out, "data_dir": data_dir, "log": log, **probe})
    steps, warmup, log = given["steps"], given["warmup"], given["log"]
    probe = {k: given[k] for k in probe}
    check_run_name(name)
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence):
        raise SettingError(f"a list of batch sizes, got {type(batch_sizes).__name__}", "batch_size")
    batch_sizes = [checked({"batch_size": b})["batch_size"] for b in batch_sizes]
    cap = memory_limit_bytes(memory_limit)  # (before the model is saved under out)
    images, arrays = _data(data, model)
    work = Path(out) / name / ".work"
    ref, saved = _model_reference(model, work, precision)
    try:
        return run(name, list(batch_sizes), Path(data_dir) if data_dir is not None else config.default_data_dir(),
                   Path(out), optimizer=optimizer, precision=precision, steps=steps, warmup=warmup,
                   memory_cap_bytes=cap, model=ref, loss=loss, images=images,
                   arrays=arrays, log=log or _quiet, **probe)
    finally:
        if saved is not None:
            saved.unlink(missing_ok=True)


@_keyword_errors
def sweep(plan=None, *, data_dir: str | Path | None = None, out: str | Path = config.DEFAULT_OUT,
          workers: int | None = None, overwrite: bool = False, retry_failed: bool = False, dry_run: bool = False,
          tensorboard: bool = False, runner: str = "local", ray_address: str | None = None, isolate: bool = False,
          worker_env: dict | None = None, log: Callable[[str], None] | None = print, **grid: object) -> dict:
    """Train the article's model over a plan's grids: `catsdogs sweep`, resumable (finished trials
    are kept; `overwrite` runs them again, `retry_failed` the failed ones). `plan`: a plan's name or
    TOML file (`catsdogs plans` lists them), a `catsdogs.plans.Plan`, or None for one grid of the
    keyword arguments: a grid's keys (`optimizer` or `opt`, `batch_size`, `dataset`, `epochs` ...)
    and a plan's top-level ones (`seeds`, `name`, `target_ci`, `noise_scale` ...), the command's
    defaults for the rest (both optimizers, batch sizes 16-128, standard data, 5 epochs, 3 seeds,
    named "sweep"); given with a plan, they override its values. `dry_run`: list the trials, train none; `tensorboard`: each finished trial exported
    for TensorBoard's HParams dashboard. Returns the status counts ({"done": 4, "failed": 0,
    "oom": 0, "trials": 4}).

    Example:
        >>> catsdogs.sweep(optimizer=["adam", "sgd"], batch_size=[16, 32], epochs=2, seeds=1)
    """
    from catsdogs import plans
    from catsdogs.analysis.tensorboard_export import live
    from catsdogs.plans.options import from_options
    from catsdogs.training.study import run_plan

    given = checked({"data_dir": data_dir, "out": out, "workers": workers, "overwrite": overwrite,
                     "retry_failed": retry_failed, "dry_run": dry_run, "tensorboard": tensorboard, "runner": runner,
                     "ray_address": ray_address, "isolate": isolate, "worker_env": worker_env, "log": log})
    if plan is not None and not isinstance(plan, (str, os.PathLike, plans.Plan)):
        raise SettingError(f"a plan's name, a TOML file's path or a catsdogs.plans.Plan, got {type(plan).__name__}",
                           "plan")
    grid = plain(grid)  # numpy's numbers as Python's: the plan checks them as it checks a TOML file's
    if "optimizer" in grid:
        grid["opt"] = grid.pop("optimizer")
    top = {k: grid.pop(k) for k in list(grid) if k in PLAN_OVERRIDES}
    unknown = sorted(set(grid) - set(plans.GRID_KEYS))
    if unknown:
        raise TypeError(f"sweep() got unexpected keyword arguments: {', '.join(unknown)}")
    grid = {k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()}
    chosen = from_options(plan, top, grid, origin="sweep()")
    g = given
    return run_plan(chosen, plans.data_dir(chosen, Path(data_dir) if data_dir is not None else None), Path(out),
                    runner=g["runner"], workers=g["workers"], isolate=g["isolate"], ray_address=ray_address,
                    worker_env=g["worker_env"], overwrite=g["overwrite"], retry_failed=g["retry_failed"],
                    dry_run=g["dry_run"], log=g["log"] or _quiet,
                    on_finished=live(g["tensorboard"] and not g["dry_run"], Path(out), chosen.name))


@_keyword_errors
def report(name: str = "sweep", *, out: str | Path = config.DEFAULT_OUT, note: str | None = None,
           find_results: Sequence[str | Path] | None = None, tensorboard: bool = False,
           export_store: str | Path | None = None, log: Callable[[str], None] | None = print) -> dict:
    """A sweep's figures and tables: `catsdogs report`; returns their paths
    ({"figures": {...}, "results_md": path, "summary_csv": path}). `find_results`: find-batch-size's
    answers to hold against it (default: every OUT/*/find_batch_size.json); `tensorboard`: the
    sweep exported for TensorBoard's HParams dashboard; `export_store`: the store copied to one file.

    Example:
        >>> catsdogs.report("sweep")["results_md"]
    """
    from catsdogs.analysis.report import export_store as export
    from catsdogs.analysis.report import report as run

    g = checked({"name": name, "out": out, "note": note, "find_results": find_results, "tensorboard": tensorboard,
                 "export_store": export_store, "log": log})
    log = g["log"] or _quiet
    if export_store is not None:
        export(Path(out), Path(export_store), log=log)
    return run(name, Path(out), note=note, log=log, find_results=g["find_results"] or None,
               tensorboard=g["tensorboard"])


# --- what the functions share -------------------------------------------------------------------


def _quiet(line: str) -> None:
    pass


def _data(data, model) -> tuple[Path | None, tuple | None]:
    """(a folder, numpy arrays) from `data`: a path, or a pair (x, y)."""
    if data is None:
        return None, None
    if isinstance(data, (str, os.PathLike)):
        return Path(data), None  # (without a model: model_check.check_options says so)
    if model is None:
        raise SettingError("your own images go with your own model: give `model` too (the article's model "
                           "trains on the prepared data)", "data")
    read = keras_data(data)
    if read is not None:  # a tf.data.Dataset (image_dataset_from_directory's too) or a PyDataset, read once
        data = read
    if isinstance(data, (tuple, list)) and len(data) == 2:
        from catsdogs.data.folder import from_arrays

        shape, classes = _model_io(model)  # a live model's, known here; any other's checked in data_for
        split = from_arrays(*data, shape=shape, classes=classes)  # before any worker starts or file is written
        return None, (split.images, split.labels)  # (as numpy arrays of the workers' dtypes: not converted again)
    raise SettingError(f"a folder of class subfolders or numpy arrays (x, y), got {type(data).__name__}", "data")


def _model_io(model) -> tuple[tuple | None, int | None]:
    """A live keras.Model's input shape (height, width, channels) and classes; (None, None) for
    a reference, whose model is built in a worker."""
    if not _is_keras_model(model):
        return None, None
    try:
        outputs = model.outputs or []
    except (AttributeError, ValueError):  # a Sequential without keras.Input: model_check says
        outputs = []
    if len(outputs) > 1:
        raise SettingError(f"has {len(outputs)} outputs; an image classifier has one", "model")
    try:
        shape, width = tuple(model.input_shape[1:]), model.output_shape[-1]
    except (AttributeError, TypeError, IndexError, ValueError):  # several inputs or outputs: model_check says
        return None, None
    return (shape if len(shape) == 3 and None not in shape else None), (None if width is None else max(2, width))


def _model_reference(model, work: Path, precision: str) -> tuple[str | None, Path | None]:
    """(the reference the workers build the model from, the file saved for it here or None)."""
    if model is None or isinstance(model, (str, os.PathLike)):
        return (None if model is None else os.fspath(model)), None
    if not _is_keras_model(model) and callable(model):
        ref = _importable(model)
        if ref is not None:
            return ref, None
        try:
            model = model()
        except CatsdogsError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's function, however it fails
            raise SettingError(f"{getattr(model, '__name__', 'the function')}() raised {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}", "model") from None
    if not _is_keras_model(model):
        raise SettingError(f"a keras.Model, a function that builds one, a PATH.keras or 'module:function', got "
                           f"{type(model).__name__}", "model")
    if precision != "float32":
        raise SettingError(f"a keras.Model keeps the precision it was built with, so precision={precision!r} "
                           "would not reach it: pass a function that builds it from a module the workers can "
                           "import (built under the policy there), or use float32", "precision")
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{os.getpid()}-{uuid.uuid4().hex[:8]}-model.keras"
    try:
        model.save(path)
    except Exception as exc:  # noqa: BLE001 - Keras's own reason: an unbuilt model, an unsavable layer
        path.unlink(missing_ok=True)
        raise SettingError(f"cannot save the model for the workers: {str(exc).splitlines()[0]}", "model") from None
    return str(path), path


def _is_keras_model(obj) -> bool:
    keras = sys.modules.get("keras")  # a keras.Model exists only where the caller imported Keras
    return keras is not None and isinstance(obj, keras.Model)


def _importable(function) -> str | None:
    """"module:function" where a worker (started in the working directory) imports the very
    function: its module a file under the working directory or installed, not __main__."""
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or module == "__main__" or not FUNCTION.match(f"{module}:{name}"):
        return None
    try:
        found = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - not importable by name here: not by a worker either
        return None
    origin = getattr(found, "__file__", None)
    if getattr(found, name, None) is not function or not origin:
        return None
    here, site = Path.cwd().resolve(), [Path(p).resolve() for p in sys.path if "site-packages" in p]
    path = Path(origin).resolve()
    return f"{module}:{name}" if any(path.is_relative_to(p) for p in (here, *site)) else None
