"""find-batch-size's options, each with its one default (the command line's too), checked in one
place (`FindSettings.check`) and recorded in find_batch_size.json (`recorded`), and the search's
bound they and the data set (`SearchBound`). The search's own constants are catsdogs.measure.search's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from catsdogs import targets
from catsdogs.data import folder as folder_data
from catsdogs.errors import SettingError
from catsdogs.measure import search
from catsdogs.measure.common import check_settings
from catsdogs.measure.search import (
    DEFAULT_MARGIN,
    DEFAULT_START,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    MODES,
    apply_margin,
)
from catsdogs.model_ref import check_loss
from catsdogs.runtime import backends
from catsdogs.schema import LIMITS, Status, check_number

RACE_BUDGET_MOST = 365 * 24 * 3600.0  # --race-budget's largest: a year of seconds
RACE_WORKERS_MOST = 64  # --workers' largest for the race (each a worker process)


@dataclass(frozen=True)
class FindSettings:
    """find-batch-size's options, each with its one default (the command line's too)."""

    name: str = "find-batch-size"  # the run: OUT/NAME/find_batch_size.json and .csv
    mode: str = "binsearch"  # power: double until out of memory; binsearch: then bisect
    start: int = DEFAULT_START  # the first batch size (halved while it does not fit)
    max_batch: int | None = None  # the largest to try
    margin: float = DEFAULT_MARGIN  # taken off the largest that fits, then rounded down
    optimizer: str = "adam"
    dataset: str = "standard"
    precision: str = "float32"
    steps: int = DEFAULT_STEPS  # timed steps per probe
    warmup: int = DEFAULT_WARMUP  # untimed steps before them
    # ... and timed for at least this long, its batches repeated (read when made: the test suite's
    # end-to-end searches time theirs briefly, tests/conftest.py's brief_probes)
    min_seconds: float = field(default_factory=lambda: search.DEFAULT_MIN_SECONDS)
    memory_cap_bytes: int | None = None  # None: a GPU's memory, or HOST_CAP_FRACTION of the host's available
    resolution: int | None = None  # the bisection's last gap (None: search.effective_resolution's)
    isolate: bool = False  # a fresh worker process for every probe
    measure_noise: bool = True  # the gradient noise scale first (--no-noise-scale: not)
    seed: int = 0  # the noise scale's short runs: this seed and the next (--seed)
    anchor: dict | None = None  # tuned learning rates to scale from (--from-store: catsdogs.analysis.anchor)
    deterministic: bool = True  # every worker's process settings
    tf32: bool | None = None
    worker_env: dict | None = None  # more of the workers' environment (the compile cache)
    model: str | None = None  # a user's model (catsdogs.model_ref; --model), None: the article's
    loss: str = "auto"  # its loss (--loss)
    images: Path | None = None  # its images: a folder of class subfolders (--data; None: prepared or random)
    effective_batch: int | None = None  # a batch the user keeps (a recipe's): its accumulation plan (--effective-batch)
    race: bool = False  # after the search, race the sizes that fit to a target (--race: catsdogs.measure.race_run)
    race_budget: float | None = None  # the race's seconds, at most (--race-budget; None: every rung)
    until: str | None = None  # the race's target (--until METRIC=VALUE; None: a reference run's)
    race_workers: int | None = None  # the race's trials at once (--workers; None: 1, on Ray the cluster's concurrency)
    race_runner: str = "local"  # where they run (--runner): worker processes here, or Ray actors
    ray_address: str | None = None  # the Ray cluster (--ray-address; None: $RAY_ADDRESS, else a local Ray)

    def check(self, model_given: bool | None = None) -> None:
        """A SettingError naming the setting, for one no search can run with. `model_given`: whether
        a user's model comes (before it is made ready: `model` names it then), else `model`'s."""
        model_given = self.model is not None if model_given is None else model_given
        if self.start > LIMITS["batch_size"][0]:
            raise SettingError(f"must be at most {LIMITS['batch_size'][0]:,}, the largest batch size, got {self.start:,}",
                               "start")
        check_settings([self.start], self.optimizer, self.dataset, self.precision, self.steps, self.warmup)
        if self.mode not in MODES:
            raise SettingError(f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}", "mode")
        if self.max_batch is not None and self.max_batch < 1:
            raise SettingError(f"--max must be >= 1, got {self.max_batch}", "max")
        if self.max_batch is not None and self.max_batch < self.start:
            raise SettingError(f"--max {self.max_batch:,} is below --start {self.start:,}: no size to search", "max")
        if self.resolution is not None and self.resolution < 1:
            raise SettingError(f"resolution must be >= 1, got {self.resolution}", "resolution")
        for key, value in (("max", self.max_batch), ("resolution", self.resolution)):
            if value is not None and value > LIMITS["batch_size"][0]:
                raise SettingError(f"must be at most {LIMITS['batch_size'][0]:,}, the largest batch size, got {value:,}",
                                   key)
        apply_margin(1, self.margin)  # validates the margin
        check_number(self.seed, "seed", least=0)
        e, most = self.effective_batch, LIMITS["batch_size"][0]
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or not 1 <= e <= most):
            raise SettingError(f"must be a whole number from 1 to {most:,}, the largest batch size, got {e!r}",
                               "effective_batch")
        check_loss(self.loss)
        self.check_race()
        if model_given and self.anchor:
            raise SettingError("the stores' tuned rates are the article's model's, not this one's", "from_store")

    def check_race(self) -> None:
        """The race's settings: each only with --race, a budget a positive number of seconds, a
        target one a sweep takes (a user's model races on real images only: model_check.Raced)."""
        if not isinstance(self.race, bool):
            raise SettingError(f"must be True or False, got {self.race!r}", "race")
        if not self.race:
            for key, value, unset in (("race_budget", self.race_budget, (None,)), ("until", self.until, (None,)),
                                      ("race_workers", self.race_workers, (None, 1)),  # (1: the default before 0.31.0)
                                      ("race_runner", self.race_runner, ("local",)), ("ray_address", self.ray_address, (None,))):
                if value not in unset:
                    raise SettingError("sets the race: give --race too (race=True)", key)
            return
        b = self.race_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b)
                              or not 0 < b <= RACE_BUDGET_MOST):
            raise SettingError(f"must be a number of seconds above 0 and at most {RACE_BUDGET_MOST:g} (a year), "
                               f"got {b!r}", "race_budget")
        if self.until is not None:
            targets.parse(self.until)
        w = self.race_workers
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= RACE_WORKERS_MOST):
            raise SettingError(f"must be a whole number from 1 to {RACE_WORKERS_MOST}, got {w!r}", "race_workers")
        if self.race_runner not in ("local", "ray"):
            raise SettingError(f"unknown runner {self.race_runner!r}; choose from local, ray", "race_runner")
        if self.ray_address is not None and self.race_runner != "ray":
            raise SettingError("names a Ray cluster: give --runner ray too (race_runner='ray')", "ray_address")
        if self.race_runner == "ray":  # (Ray missing said before any probe, not after the search)
            from catsdogs.training.ray_runner import import_ray

            import_ray()

    def environment(self) -> dict:
        """Every worker's environment: its process settings, and what `worker_env` adds."""
        return {**(self.worker_env or {}), **backends.process_env_for(self.deterministic, self.tf32)}

    def recorded(self, image_size: int, cpu_cap: int | None, data_dir: Path, data_fingerprint: str | None = None) -> dict:
        """The settings as find_batch_size.json records them."""
        return {"name": self.name, "mode": self.mode, "start": self.start, "max": self.max_batch,
                "margin": self.margin, "optimizer": self.optimizer, "dataset": self.dataset,
                "precision": self.precision, "steps": self.steps, "warmup": self.warmup, "min_seconds": self.min_seconds,
                "resolution": self.resolution, "memory_cap_bytes": self.memory_cap_bytes,
                "noise_scale": self.measure_noise, "seed": self.seed, "anchor": self.anchor,
                "deterministic": self.deterministic, "tf32": self.tf32, "cpu_cap_bytes_default": cpu_cap,
                "image_size": image_size, "data_dir": str(Path(data_dir).resolve()),
                "data_fingerprint": data_fingerprint,
                **({"model": self.model, "loss": self.loss, "images": str(self.images) if self.images else None}
                   if self.model is not None else {}),
                **({"effective_batch": self.effective_batch} if self.effective_batch is not None else {}),
                **({"race": True, "race_budget": self.race_budget, "until": self.until,
                    "race_workers": self.race_workers, "race_runner": self.race_runner} if self.race else {})}


@dataclass(frozen=True)
class SearchBound:
    """The largest batch size the search probes, and why: --max when given, else the training
    split (the prepared data's, or the training part of a --data folder), since no batch larger
    than the data can be trained on them; None where neither says (a user's model on random
    images, no --max): then memory alone stops the search."""

    batch_size: int | None
    by: str | None  # "max" or "data"
    train_images: int | None

    @classmethod
    def of(cls, settings: FindSettings, manifest: dict | None, probe_data) -> SearchBound:  # probe_data: model_check.ProbeData or None
        if probe_data is not None and probe_data.own:
            train = folder_data.train_count(probe_data.count or 0) or None
        elif manifest:
            train = sum(manifest["counts"][settings.dataset]["train"].values())
        else:
            train = None
        if settings.max_batch is not None:
            return cls(settings.max_batch, "max", train)
        return cls(train, "data" if train else None, train)

    def stopped_by(self, result) -> str:
        """What ended the search: "data" or "max" (every size up to the bound fit), "memory" (a
        size ran out of it), or "failures" (sizes failed for another reason)."""
        if result.reached_max:
            return self.by or "max"
        if result.first_failure is not None and result.statuses.get(result.first_failure) == Status.OOM:
            return "memory"
        return "memory" if result.largest_fit is None and Status.OOM in result.statuses.values() else "failures"

    def as_json(self) -> dict:
        return {"batch_size": self.batch_size, "by": self.by, "train_images": self.train_images}
