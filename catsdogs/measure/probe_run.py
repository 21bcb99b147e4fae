"""The search's probes (`ProbeRun`), in the order run: each run once by the prober
(catsdogs.measure.prober), numbered, named by its phase and logged; the sizes the recommendation
could fall on timed again (`retime`); and the search's aim (`guess`), the memory model's
prediction carried on by a GPU's exact peaks. find_batch_size drives it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from catsdogs.data import folder as folder_data
from catsdogs.data import loading
from catsdogs.manifest import require_prepared
from catsdogs.measure import gpu_pool, model_check
from catsdogs.measure import prober as probers
from catsdogs.measure.find_summary import probe_line
from catsdogs.measure.search import DEFAULT_STEPS
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import BETWEEN, CHECK, RETIME, ProbeRecord, ProbeTask
from catsdogs.runtime import backends
from catsdogs.schema import Status
from catsdogs.training.costs import PLAN_MOST

RETIME_ROUNDS = 2  # the contested sizes timed again twice, in alternating order: each size's step time a median of 3
RETIME_ROOM = 0.75  # a size is timed again beside the others' steps where its peak left a quarter of its cap free
RETIME_FILL = 0.9  # a live worker times a size while what it holds plus that step stays within this share
# JAX on the CPU: a probe near the limit (a fresh worker's: at or above `fresh_from`) times this many
# steps after its warm-up, not --steps' default 3, where they last --min-seconds. XLA runs one static
# buffer plan every step, so the steps after the first add little to the peak: at 900 images (64 px,
# SGD, benchmarks/bench_probe_steps.py, four fresh workers a side in turn) one timed step peaked at
# 1,928.5 MiB and three at 1,936.9 (medians, +0.44%: 5 images' worth, a tenth of the search's 5%),
# and the two steps more cost 3.65 s a probe. TensorFlow's peak grew more after its first step
# (+26.4 MiB at 760, +1.36%, one run +124) for 0.76 s, so it keeps its three.
NEAR_LIMIT_STEPS = 1
FIRST_STEP_PEAK = ("jax",)  # the backends whose step peaks in its first run


class DecodedCopy:
    """The prepared data set decoded once, by a thread of this process, into the run's work folder
    (loading.save_decoded), for every probe's worker to read instead of decoding its JPEGs: each
    fresh worker decoded all 2,000 (at 64 px 0.50 s on two cores, where reading the copy takes
    0.02 s: benchmarks/bench_decoded_copy.py), and find-batch-size starts six to eight. Begun as the
    run begins, while the first worker starts; the first probe awaits it. Its path is None where it
    could not be made (the workers then decode, as before). A worker reading it holds 2-3 MiB less
    before its model than one decoding (a trial still decodes; the decoder's threads' own memory), and
    its probe peaks within a few MiB of the same (bench_decoded_copy.py --workers): within noise."""

    def __init__(self, data_dir: Path, dataset: str, work: Path):
        self._path: Path | None = None
        self._thread = threading.Thread(target=self._make, args=(Path(data_dir), dataset, Path(work)),
                                        name="catsdogs-decode", daemon=True)
        self._thread.start()

    def _make(self, data_dir: Path, dataset: str, work: Path) -> None:
        try:
            fingerprint = require_prepared(data_dir)["fingerprint"][dataset]
            splits = loading.load_dataset(data_dir, dataset)
            if require_prepared(data_dir)["fingerprint"][dataset] != fingerprint:
                return  # changed while it was read: the workers decode, and check it themselves
            self._path = loading.save_decoded(splits, fingerprint,
                                              folder_data.copy_path(work, f"prepared-{dataset}-{fingerprint[:16]}"))
        except Exception:  # noqa: BLE001 - an optimisation: whatever stops it, the workers decode
            self._path = None

    def path(self) -> str | None:
        """The copy's path, once made (waited for); None where there is none."""
        self._thread.join()
        return str(self._path.resolve()) if self._path is not None else None

    def remove(self) -> None:
        """The copy let go (every worker is done with it)."""
        self._thread.join()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None


class ProbeRun:
    """The search's probes, in the order run: each run once by the prober (catsdogs.measure.prober),
    numbered, named by its phase (calibrate, check, predict, search, confirm, critical, retime,
    between) and logged."""

    def __init__(self, settings: FindSettings, data_dir: Path, work: Path, cpu_cap: int | None, env: dict, log,
                 probe_data: model_check.ProbeData | None = None):
        self.settings, self.data_dir, self.log = settings, Path(data_dir), log
        self.work, self.env = work, env  # (the noise scale's short runs write and start there too)
        self.probe_data = probe_data  # a user's model's: its images, or random ones (model_check.data_for)
        self.probes: list[ProbeRecord] = []
        self.prober = probers.Prober(work, settings.memory_cap_bytes, cpu_cap_bytes=cpu_cap, isolate=settings.isolate,
                                     env=env)
        self.prediction: dict | None = None  # the memory model's, before the search
        self.refined: dict | None = None  # ... carried on by the search's own probes (`guess`)
        self.ceiling_from: ProbeRecord | None = None  # the out-of-memory probe the last `ceiling` read
        # the prepared data decoded once for the probes' workers (not a user's images: model_check's copy)
        on_prepared = probe_data is None or (probe_data.manifest is not None and not probe_data.input_spec)
        self.decoded = DecodedCopy(data_dir, settings.dataset, work) if on_prepared else None

    def probe(self, batch_size: int, phase: str, fresh: bool = False, aside: bool = False) -> ProbeRecord:
        """The probe of `batch_size`: run now (in a fresh worker with `fresh`; `aside`: one of its
        own, the current worker kept for the next probes: Prober.run_aside), or the one already run."""
        for p in self.probes:
            if p.batch_size == batch_size:
                return p
        return self._run(batch_size, phase, fresh=fresh, aside=aside)

    # --- which worker runs what: the prober's spares, started ahead ----------------------------------

    def start_ahead(self, count: int = 1, only_beside: bool = False) -> None:
        """Have the next `count` fresh workers import now, while other work runs (Prober.prestart);
        `only_beside`: only where spares run beside the probes (the CPU), not where the one worker
        started would wait alone."""
        if not only_beside or self.prober.spares:
            self.prober.prestart(count)

    def on_resident_sets(self) -> bool:
        """Whether the probes' memory is a resident set (the CPU's), as the calibration's was."""
        return bool(self.probes) and self.probes[0].memory_kind == "cpu-rss"

    def on_gpu(self) -> bool:
        return any(p.memory_kind and p.memory_kind.startswith("gpu") for p in self.probes)

    def start_way_up(self, bound: int | None) -> None:
        """On the CPU, where the search will reach the sizes that run in fresh workers (the
        prediction's `fresh_from`), the first of them imports while the way up runs."""
        fresh_from = self.prober.fresh_from
        if self.on_resident_sets() and fresh_from is not None and (bound is None or bound >= fresh_from):
            self.prober.prestart()

    @staticmethod
    def can_retime(probe: ProbeRecord) -> bool:
        """Whether a size left room enough under its cap to be timed again beside the others' steps
        (a retime's worker keeps them all): its peak at most RETIME_ROOM of the cap, or no cap known."""
        cap = probe.memory_cap_mb or probe.device_memory_limit_mb
        return not cap or probe.peak_memory_mb is None or probe.peak_memory_mb <= RETIME_ROOM * cap

    # --- the probes ------------------------------------------------------------------------------------

    def retime(self, sizes: list[int], rounds: int = RETIME_ROUNDS, first: dict[int, str] | None = None) -> None:
        """`sizes` timed again, `rounds` times in alternating order (largest first, the search's
        reversed): their step times from probes a minute apart, so that a phase of the machine's
        load weighs on no size alone (goodput.passed takes each size's median). A size no probe
        has run yet is first timed there, named by `first` (else "between": goodput.between's
        gaps); its memory there, beside the others' steps, says nothing.
        Each look runs in the live worker, which keeps every size's compiled step for its second
        look, while that worker has room for it (`_live_worker_has_room`: on the CPU, where --max
        or the data bound the search far from the limit, the search's own worker, sparing a
        start); else in a fresh one (a worker that ran the limit's probes holds memory a small
        step then has to share the cap with, and on JAX each kept step holds more: one worker's
        ten looks can pass a small cap). On a GPU, whose memory is not
        the resident set, and under isolate, the first look starts a fresh worker and the others
        follow in it."""
        order = [b for r in range(rounds) for b in (sorted(sizes, reverse=True) if r % 2 == 0 else sorted(sizes))]
        need = self._retime_need(sizes)
        for n, b in enumerate(order):  # each size's compiled step kept for its second look (timing_only)
            probed = any(p.batch_size == b for p in self.probes)
            phase = RETIME if probed else (first or {}).get(b, BETWEEN)
            room = self._live_worker_has_room(need)
            fresh = room is False or (n == 0 and room is None)
            self._run(b, phase, fresh=fresh, timing=not fresh, timing_only=True, spare=False)  # the last fresh workers

    def _retime_need(self, sizes: list[int]) -> float:
        """What timing `sizes` may add to a worker's resident set, in MiB: the most any of their
        probes peaked above the least peak of a probe that passed (the runtime's own). A size not
        probed yet lies below one that was (goodput.between)."""
        done = [p for p in self.probes if p.status == Status.DONE and p.peak_memory_mb]
        if not done:
            return 0.0
        base = min(p.peak_memory_mb for p in done)
        return max((p.peak_memory_mb - base for p in done if p.batch_size in sizes), default=0.0)

    def _live_worker_has_room(self, need: float) -> bool | None:
        """Whether the live worker can time a size beside what it holds: its resident set now plus
        `need` within RETIME_FILL of the cap (the tenth left over is the next kept step's). None where that is not known (no live worker; a GPU's memory; no cap)."""
        held = self.prober.resident_mb()
        cap = next((p.memory_cap_mb for p in reversed(self.probes) if p.memory_cap_mb), None)
        if held is None or not cap:
            return None
        return held + need <= RETIME_FILL * cap

    def _run(self, batch_size: int, phase: str, fresh: bool = False, timing: bool = False,
             timing_only: bool = False, aside: bool = False, spare: bool = True) -> ProbeRecord:
        s = self.settings
        task = ProbeTask(batch_size, str(self.data_dir.resolve()), optimizer=s.optimizer, dataset=s.dataset,
                         precision=s.precision, steps=self._timed_steps(batch_size, timing_only),
                         warmup=s.warmup, deterministic=s.deterministic,
                         tf32=s.tf32, min_seconds=s.min_seconds, model=s.model, loss=s.loss,
                         timing_only=timing_only, decoded=self.decoded.path() if self.decoded else None,
                         **(self.probe_data.task_fields() if self.probe_data else {}))
        started = time.perf_counter()
        p = self.prober.run_aside(task) if aside else self.prober.run(task, fresh=fresh, timing=timing, spare=spare)
        p.order, p.phase, p.wall_seconds = len(self.probes) + 1, phase, round(time.perf_counter() - started, 2)
        self.probes.append(p)
        self.log(probe_line(p))
        return p

    def _timed_steps(self, batch_size: int, timing_only: bool) -> int:
        """A probe's timed steps: the settings' (--steps), or NEAR_LIMIT_STEPS for a probe of memory
        near the limit on the CPU on a backend whose step peaks in its first run (FIRST_STEP_PEAK),
        where --steps is its default value (given or not): those steps are seconds each, and their
        peak is the first's."""
        s, fresh_from = self.settings, self.prober.fresh_from
        near = fresh_from is not None and batch_size >= fresh_from and not timing_only
        if near and s.steps == DEFAULT_STEPS and self.on_resident_sets() and backends.name() in FIRST_STEP_PEAK:
            return min(s.steps, NEAR_LIMIT_STEPS)
        return s.steps

    def probe_on_the_way(self, batch_size: int, critical: int | None) -> str:
        """The search's probe of `batch_size`, and before it the critical batch size's, when that
        lies between the largest probed so far and `batch_size`: so it runs in the worker of the
        search's way up, where a probe costs a fraction of a second, not in a fresh one."""
        done = max((p.batch_size for p in self.probes if p.phase != CHECK), default=0)  # (the replay's: aside)
        if critical is not None and done < critical < batch_size:
            self.probe(critical, "critical")
        return self.probe(batch_size, "search").status

    def guess(self) -> int | None:
        """The largest batch size that fits, as the search should aim for it now: the memory
        model's prediction, or, once two probes above what the model was fitted on have
        fitted with an exact peak (a GPU's allocator, whose bytes in use no retained region
        inflates; never a reused CPU worker's resident set), the line through the largest two,
        when it climbs more steeply than the model's: on a GPU the device's own workspaces grow
        faster than XLA's plan above a few hundred images (docs/gpu.md)."""
        exact = sorted((p for p in self.probes if p.status == Status.DONE and p.memory_kind == "gpu-worker"
                        and p.peak_memory_mb and p.batch_size > PLAN_MOST), key=lambda p: p.batch_size)
        cap = next((p.device_memory_limit_mb or p.memory_cap_mb for p in reversed(exact)), None)
        plan_slope = (self.prediction or {}).get("per_image_bytes", 0.0) / 2**20
        if len(exact) >= 2 and cap:
            a, b = exact[-2], exact[-1]
            slope = (b.peak_memory_mb - a.peak_memory_mb) / (b.batch_size - a.batch_size)
            # the device's workspaces add to the plan, never take from it: a slope below the plan's
            # is a kernel's choice changing between the two sizes (the H200's 920 peaked above 1,024)
            if slope > max(0.0, plan_slope):
                best = b.batch_size + int((cap - b.peak_memory_mb) // slope)
                if (pool := (self.prediction or {}).get("pool")) is not None:  # one region still holds the step
                    best = min(best, pool["max_batch_size"])
                if not self.refined or self.refined["max_batch_size"] != best:
                    self.refined = {"max_batch_size": best, "from": [a.batch_size, b.batch_size]}
                    self.log(f"The prediction carried on by the probes of {a.batch_size} and {b.batch_size} "
                             f"(their exact peaks on a GPU): {best}.")
                return best
        return self.prediction["max_batch_size"] if self.prediction else None

    def ceiling(self) -> int | None:
        """The largest batch size whose step's buffer the worker's pool can still give, as its last
        out-of-memory said (gpu_pool.ceiling); None where the probes do not share one worker's
        pool (only JAX on a GPU recovers in place) or the allocator did not tell it."""
        if not self.prober.in_place:
            return None
        since = max((i for i, p in enumerate(self.probes) if p.worker != "reused"), default=0)  # this worker's
        ooms = [p for p in self.probes[since:] if p.status == Status.OOM and p.allocator_stats]
        self.ceiling_from = ooms[-1] if ooms else None
        return gpu_pool.ceiling(self.ceiling_from) if ooms else None

    def ceiling_record(self, result) -> dict | None:
        """find_batch_size.json's `pool_ceiling` where the ceiling ended the search (search.SearchResult):
        the bound, the out-of-memory probe it comes from, and that probe's allocator's words (MiB)."""
        failed = self.ceiling_from  # the probe whose words the search ended on
        if result.ceiling is None or failed is None:
            return None
        return {"batch_size": result.ceiling, "from": failed.batch_size,
                "per_image_mb": failed.oom_asked_mb / failed.batch_size if failed.oom_asked_mb else None,
                "largest_free_mb": failed.oom_largest_free_mb, "pool_mb": failed.oom_pool_mb}

    def close(self) -> None:
        try:
            if self.decoded:
                self.decoded.remove()
        finally:  # the workers end whatever happens to the copy (a Ctrl-C while it is awaited)
            self.prober.close()


