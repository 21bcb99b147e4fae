"""The stand-ins the tests put where a worker, a prober, a slot or a device would be: one module,
so that a fake is written once and its behaviour read in one place."""

from __future__ import annotations

from pathlib import Path

from catsdogs.messages import ProbeRecord
from catsdogs.training.costs import (
    predicted_peak_bytes,
)

MiB = 2**20
SIZE = 64  # the image size LinearProber predicts its peaks at


class FakeWorker:
    """A worker that holds `retained` MiB more for every probe it ran before (what allocators
    keep), and fits a probe when base + batch + what it retains stays under the cap (MiB)."""

    cap_mb, started = 100, []

    def __init__(self, log_path, env=None):
        self.log_path, self.tasks, self.largest_batch, self.device, self.alive = Path(log_path), 0, 0, "cpu", False
        self.env = env
        self.ready = self.paused = False
        self.pauses, self.beside_timing = [], None  # pause(True/False) as asked; who ran while it timed
        FakeWorker.started.append(self)

    def launch(self):
        self.alive, self.ready = True, False

    def start_or_record(self):
        self.alive = self.ready = True

    def run(self, task, memory_cap_bytes=None, on_progress=None):
        if not self.alive:
            self.start_or_record()
        if on_progress:  # as run_probe says it: its timed steps begin, then end
            on_progress({"timing": True})
            self.beside_timing = [w for w in FakeWorker.started if w is not self and w.alive and not w.paused]
            on_progress({"timing": False})
        peak = 10 + task.batch_size + 5 * self.tasks
        self.tasks += 1
        self.largest_batch = max(self.largest_batch, task.batch_size)
        fits = peak <= self.cap_mb
        if not fits:
            self.alive = False  # as the real worker: gone after a probe that did not end done
        return ProbeRecord(batch_size=task.batch_size, status="done" if fits else "oom", peak_memory_mb=peak,
                           memory_kind="cpu-rss")

    def pause(self, paused):
        self.paused = paused
        self.pauses.append(paused)

    def kill(self):
        self.alive = False

    def close(self):
        self.alive = False


class GpuWorker(FakeWorker):
    """A JAX worker on a GPU: out of memory, it recovers in place (its record says how much its
    allocator kept: `residue`, MiB), and stays alive when nothing was kept, as the real one does
    (ProbeRecord.keeps_worker)."""

    residue = 0.0

    def start_or_record(self):
        super().start_or_record()
        self.device = "gpu"

    def run(self, task, memory_cap_bytes=None, on_progress=None):
        if not self.alive:
            self.start_or_record()
        self.tasks += 1
        fits = 10 + task.batch_size <= self.cap_mb
        record = ProbeRecord(batch_size=task.batch_size, status="done" if fits else "oom",
                             memory_kind="gpu-worker", residue_mb=None if fits else self.residue)
        self.alive = record.keeps_worker()
        return record


def recording_tasks(run) -> list:
    """Stand in for a ProbeRun's prober: every probe's task kept, in order, in the list returned,
    each probe ending done at 500 MiB of a CPU's resident set."""
    tasks = []

    def run_task(task, **kw):
        tasks.append(task)
        return ProbeRecord(batch_size=task.batch_size, status="done", peak_memory_mb=500.0, memory_kind="cpu-rss")

    run.prober.run = run_task
    return tasks


class LinearProber:
    """Stands in for the prober: a probe's peak is what the BFC replay says over a 700 MiB
    runtime (so the prediction is exact), under the prober's cap; with `kernel_mb_per_image`,
    another CPU's, whose kernels hold that much more an image past batch size 1."""

    base_mb, calls, asides, record_extra, kernel_mb_per_image = 700.0, [], [], {}, 0.0
    in_place = False  # the CPU's rules (fresh workers near the limit)
    spares = False  # (no worker to launch ahead)

    def __init__(self, workdir, memory_cap_bytes=None, cpu_cap_bytes=None, isolate=False, fresh_from=None, env=None):
        self.cap_mb, self.fresh_from = memory_cap_bytes / 2**20, fresh_from
        LinearProber.calls, LinearProber.asides = [], []

    def run(self, task, fresh=False, timing=False, spare=True):
        peak = predicted_peak_bytes(task.batch_size, self.base_mb * MiB, SIZE, train_images=48,
                                    steps=task.warmup + task.steps) / MiB
        peak += self.kernel_mb_per_image * (task.batch_size - 1)
        LinearProber.calls.append((task.batch_size, self.fresh_from))
        fresh = self.fresh_from is not None and task.batch_size >= self.fresh_from
        fits = peak <= self.cap_mb
        return ProbeRecord(batch_size=task.batch_size, status="done" if fits else "oom",
                           peak_memory_mb=peak if fits else self.cap_mb + 1,  # a probe is killed at the cap
                           memory_kind="cpu-rss", memory_cap_mb=self.cap_mb,
                           images_per_second=100.0, worker="fresh" if fresh else "reused",
                           **LinearProber.record_extra)

    def run_aside(self, task):
        LinearProber.asides.append(task.batch_size)
        return self.run(task, fresh=True)

    def prestart(self, count=1):
        pass

    def resident_mb(self):  # not known (a GPU's, say): the retime starts a fresh worker
        return None

    def close(self):
        pass


class SqrtSpeedProber(LinearProber):
    """LinearProber whose throughput grows as the square root of the batch size (the step time too):
    T(B) = (1 + B_noise/B) sqrt(B) is least at B = B_noise."""

    def run(self, task, fresh=False, timing=False, spare=True):
        record = super().run(task)
        record.images_per_second = 100.0 * task.batch_size ** 0.5
        return record


class UnluckyProber(SqrtSpeedProber):
    """SqrtSpeedProber on a device of `kind` whose first probe of 16 ran in a busy moment of the
    machine (with `unlucky`): half its speed."""

    timed: list = []
    kind, unlucky = "cpu-rss", True

    def run(self, task, fresh=False, timing=False, spare=True):
        record = super().run(task)
        record.memory_kind = UnluckyProber.kind
        UnluckyProber.timed.append((task.batch_size, timing))
        if UnluckyProber.unlucky and task.batch_size == 16 and sum(b == 16 for b, _ in UnluckyProber.timed) == 1:
            record.images_per_second /= 2
        return record


class ResidentProber(LinearProber):
    """LinearProber whose probes peak at 500 MiB plus one a batch image, under a 1000 MiB cap, in a
    worker whose resident set is `held` MiB after the search and grows by `per_look` MiB a look
    (every step it keeps), from 700 MiB in a fresh one; it records how each probe is asked."""

    held, per_look = 600.0, 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.resident = ResidentProber.held

    def run(self, task, fresh=False, timing=False, spare=True):
        LinearProber.calls.append((task.batch_size, fresh, timing))
        self.resident = (700.0 if fresh else self.resident) + ResidentProber.per_look
        return ProbeRecord(batch_size=task.batch_size, status="done", peak_memory_mb=500.0 + task.batch_size,
                           memory_kind="cpu-rss", memory_cap_mb=self.cap_mb, images_per_second=100.0,
                           worker="fresh" if fresh else "reused")

    def resident_mb(self):
        return self.resident


# --- a sweep slot in this process ---------------------------------------------------------------


class InProcessSlot:
    """A sweep slot that runs each trial in this process's engine (TensorFlow), where a local slot
    runs it in a worker process: for tests of what a sweep decides (its rounds, resuming, its
    records), not of how its workers live and die (tests/training/test_engine.py). The engine is the
    same, and its results are the same to the bit in a worker or alone (tests/training/test_engine.py)."""

    def __init__(self, slot: int = 0, workers: int = 1, workdir: Path | None = None):
        pass

    def shapes(self) -> set[str]:
        from catsdogs.training import steps

        return set(steps.STEPS.shapes())

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None):
        from catsdogs.messages import TrialTask
        from catsdogs.training import engine

        return engine.run_task(TrialTask(cfg, str(Path(data_dir).resolve()), noise_sampling, eval_every),
                               emit=lambda kind, row: on_epoch(row) if on_epoch else None)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


# --- a device for the pure search -----------------------------------------------------------------


class FakeDevice:
    """Fits up to `limit`; `failing` sizes fail for another reason; counts every probe."""

    def __init__(self, limit: int, failing=()):
        self.limit, self.failing, self.calls = limit, set(failing), []

    def __call__(self, b: int) -> str:
        self.calls.append(b)
        if b in self.failing:
            return "failed"
        return "done" if b <= self.limit else "oom"


# --- a device the race runs on --------------------------------------------------------------------


class RaceDevice:
    """Steps to a target as the paper's model has them, S(B) = S_MIN (1 + B_noise / B), worse away
    from each size's best rate (`best_factor` times the rule's rate: by exp(RATE_COST (log2 f)^2)),
    each seed's steps log-normal about that median with `log_sd` (by batch size) and a seed's own
    luck shared by every arm (`shared`); times a step time by batch size. Its true median time for
    each arm is known, so a race's answer can be judged against the best."""

    S_MIN, RATE_COST = 40.0, 0.35

    def __init__(self, step_seconds: dict[int, float], b_noise: float, log_sd: dict[int, float],
                 best_factor: dict[int, float] | None = None, shared: float = 0.7, seed: int = 0):
        import numpy as np

        self.step_seconds, self.b_noise, self.log_sd = step_seconds, b_noise, log_sd
        self.best_factor, self.shared = best_factor or {}, shared
        self.rng = np.random.default_rng(seed)
        self.luck: dict[int, float] = {}  # each seed's shared luck
        self.runs = 0

    def rule_rate(self, b: int) -> float:
        return 0.01 * b / 32  # any rule: the race's rates are factors of it

    def median_steps(self, b: int, lr: float) -> float:
        import math

        f = lr / (self.rule_rate(b) * self.best_factor.get(b, 1.0))
        return self.S_MIN * (1 + self.b_noise / b) * math.exp(self.RATE_COST * math.log2(f) ** 2)

    def median_seconds(self, b: int, lr: float) -> float:
        return self.median_steps(b, lr) * self.step_seconds[b]

    def run(self, b: int, lr: float, seed: int, cap: float | None) -> tuple[float, bool]:
        """(seconds to the target, censored): a run of this arm and seed, stopped at `cap`."""
        import math

        self.runs += 1
        sd = self.log_sd[b]
        luck = self.luck.setdefault(seed, float(self.rng.normal()))
        own = float(self.rng.normal())
        z = math.sqrt(self.shared) * luck + math.sqrt(1 - self.shared) * own
        seconds = self.median_seconds(b, lr) * math.exp(sd * z)
        return (cap, True) if cap is not None and seconds > cap else (seconds, False)

    def trial_seconds(self, b: int, lr: float, seed: int) -> float:
        """A run's seconds to the target, as `run`'s but the same whenever it is asked (its own luck
        drawn from the arm and seed, the seed's shared luck from the seed): a race that resumes
        sees the trials it ran before as they were."""
        import math

        import numpy as np

        luck = float(np.random.default_rng([7, seed]).normal())
        own = float(np.random.default_rng([7, seed, b, round(lr * 1e9)]).normal())
        z = math.sqrt(self.shared) * luck + math.sqrt(1 - self.shared) * own
        return self.median_seconds(b, lr) * math.exp(self.log_sd[b] * z)


class RaceSlot:
    """A sweep slot whose trials are a RaceDevice's (catsdogs.measure.race_run's trials without
    training): a trial with a target trains until `trial_seconds`, its epochs or its step cap run out, its
    epochs each `step_seconds` a step; a reference run (no target) ends its epochs at validation
    losses REFERENCE_LOSSES. Each trial's wall time is its steps' plus `fixed` seconds. `ran`:
    every trial run, in order; `interrupt_after`: a Ctrl-C in the main thread as that trial ends;
    `stuck(batch, lr, seed)`: the runs that sit at chance (stopped an epoch in when the trial says
    `stop_at_chance`, its last point marked stuck; else trained to the end of their cap). `clock`: a
    one-element list, each trial's wall seconds added to it as it ends (a race's simulated time)."""

    REFERENCE_LOSSES = (0.62, 0.55, 0.503, 0.47)

    def __init__(self, device: RaceDevice, n_train: int, fixed: float = 0.5, ran: list | None = None,
                 interrupt_after: int | None = None, slower=lambda seed: 1.0, users: list | None = None,
                 stuck=lambda b, lr, seed: False, clock: list | None = None):
        self.device, self.n_train, self.fixed, self.slower, self.stuck = device, n_train, fixed, slower, stuck
        self.clock = clock
        self.ran = ran if ran is not None else []
        self.users = users if users is not None else []  # each trial's user model (TrialTask.user), in order
        self.interrupt_after = interrupt_after

    def shapes(self) -> set[str]:
        return set()

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None):
        import _thread
        import math

        from catsdogs.messages import TrialRecord
        from catsdogs.schema import Status

        self.ran.append(cfg)
        self.users.append(user)
        b, step = cfg.batch_size, self.device.step_seconds[cfg.batch_size]
        per_epoch = max(1, self.n_train // b)
        clock = step * self.slower(cfg.seed)  # a trial's own step time, where the device's is its probe's
        stuck = cfg.until is not None and self.stuck(b, cfg.lr, cfg.seed)
        if cfg.until is None:
            history = [{"epoch": e + 1, "seconds": per_epoch * clock, "val_loss": self.REFERENCE_LOSSES[e]}
                       for e in range(cfg.epochs)]
            steps, reached, to_target = per_epoch * cfg.epochs, None, None
        else:
            needed = math.inf if stuck else self.device.trial_seconds(b, cfg.lr, cfg.seed) / step
            allowed = min(cfg.epochs * per_epoch, cfg.max_steps or math.inf)  # (a step cap within an epoch)
            if stuck and cfg.stop_at_chance:
                allowed = min(allowed, per_epoch + 1)  # (an epoch at chance after its first point)
            reached = needed <= allowed
            steps = math.ceil(needed) if reached else allowed
            to_target = needed if reached else None
            history = [{"epoch": e + 1, "train_seconds": per_epoch * clock, "seconds": per_epoch * clock + 0.1}
                       for e in range(steps // per_epoch)]  # (an epoch's seconds hold its validation)
            if steps % per_epoch:
                history.append({"epoch": len(history) + 1, "train_seconds": steps % per_epoch * clock,
                                "seconds": steps % per_epoch * clock, "batches": steps % per_epoch})
        if self.clock is not None:
            self.clock[0] += steps * clock + self.fixed
        if self.interrupt_after is not None and len(self.ran) == self.interrupt_after:
            _thread.interrupt_main()
        curve = [{"step": steps, "val_loss": 0.693, "val_accuracy": 0.5, "stuck": True}] \
            if stuck and cfg.stop_at_chance else None
        return TrialRecord(status=Status.DONE, test_accuracy=0.5, history=history, steps=steps,
                           target_reached=None if reached is None else int(reached), steps_to_target=to_target,
                           wall_seconds=steps * clock + self.fixed, curve=curve)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass
