"""find-batch-size's statistics: the gradient noise scale B_simple (catsdogs.gradient_noise),
measured before the search past the first epoch's transient.

Four short runs at the base batch size (32), seeds --seed and the next three, each trained 2
epochs as a sweep's trial is at the rate the learning-rate rule anchors on (the short runs' best of
three, or a store's), in workers that end before any probe runs (on a CPU up to three at once:
`noise_workers`); B_simple measured after epoch 2 of each, past the first epoch's transient, and
pooled with each seed one cluster weighted alike (`measure_noise_scale`: gradient_noise.pool_seeds,
the geometric mean of the seeds' values, its interval on seeds - 1 degrees of freedom). The
article's model by per-example gradient products, pairs of 1 and 25 images (`noise_sampling`); a
user's model by the two-batch estimator on micro-batches (`user_noise_sampling`). Imports no
framework: the runs are a worker's.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from catsdogs import config
from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling, pool_seeds
from catsdogs.host import host_memory_available, usable_cores, visible_gpus
from catsdogs.measure import model_check
from catsdogs.measure.common import first_line
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import TrialRecord, TrialTask
from catsdogs.recommendation import anchor_at, learning_rate, short_run_anchor
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker, run_together
from catsdogs.schema import DEFAULT_LR, Status, TrialConfig, default

# find-batch-size's noise measurement, the one the recommendation rests on: larger pairs than a
# sweep's, over four short runs, past their first epoch (measure_noise_scale). A pair of 25 images
# gives |G|^2 from 600 products of two examples' gradients where a pair of 10 gives 90: for about
# the same images, intervals a third as wide (docs/results.md, "The noise scale find-batch-size
# decides with"; studies/noise_spread.py). What varies most is not the pairs but the seeds: the
# same protocol measured 28 (17 to 79) at seeds 2-3 and 5 (4 to 6) at seeds 4-5, so each seed is
# one cluster and the interval is over seeds; four seeds are the fewest whose geometric mean
# moved less than 2-fold with which four (docs/results.md), paid for with one measurement a seed
# and 2 epochs a run where 0.16.0 took two and 3 over two seeds.
NOISE_PAIRS = 2 * config.NOISE_PAIRS  # pairs a measurement: 16, one measurement a seed
NOISE_LARGE = 25  # images a pair (each its own micro-batch: B_s 1, B_b 25)
NOISE_EPOCHS = 2  # each short run's epochs: measured after the 2nd, past the first's transient
NOISE_FROM = 2  # the first epoch whose measurement counts
NOISE_SEEDS = 4  # short runs, each its own seed and one cluster: one seed's trajectory is one draw
# Without a store's tuned rate (--from-store), the first seed trains first at Keras's default rate
# and 3 and 10 times it, and the validation loss after 2 epochs of the three anchors the
# learning-rate rule (the largest rate within ANCHOR_TIE of the least); where none of the three
# trained (whether a run takes off within 2 epochs is the seed's luck on this model: seed 4
# collapsed at 0.01 and stayed at chance at 0.03 and 0.1),
# the next seed tries them, up to ANCHOR_SEEDS; none took off at all, Keras's default, said. Why:
# Keras's default is not a tuned rate (the tuned plans chose SGD 0.1 and Adam 0.01 on the article's
# model, ten times it), and a ramp of Smith's range test said nothing on this model within a budget
# that fits (docs/results.md, "The learning rate's anchor"). Then the noise seeds train at the
# rate the rule anchors on (`noise_rate`), the first seed's run at it reused: B_simple is read
# where training at the recommended rates would be (before 0.29.0 at Keras's default, where SGD's
# runs sat near chance). Not the noise seeds at every rate: runs at rates that did not train took
# B_noise's interval down to 0.6 and the recommendation to batch 1 on JAX. A rate is set at a
# compiled step's reset (TrialConfig.shape): the extra runs cost their training and one measurement each.
RATE_FACTORS = (3.0, 10.0)
ANCHOR_SEEDS = 2
# A run ranks rates when it took off: its final loss below this share of chance's (after 2 epochs
# here runs that took off ended at 0.36-0.44, runs that did not at 0.59-0.69 (ln 2 = 0.693), and one
# at 0.675, barely moved, had chosen its rate by the noise of an untrained loss).
ANCHOR_LEARNED = 0.9
# Among the rates that took off, the largest whose final loss is within this factor of the least
# anchors the rule, not the least's own: one seed cannot rank rates closer than that. On the article's
# model at 64 px (TensorFlow, 12 seeds a rate, studies/anchor_rates.py) one seed's paired comparison
# of two neighbouring rates, the log of their losses' ratio, varies by 0.17-0.30 (a factor 1.19-1.36)
# from seed to seed, and the least loss chose Adam's 0.001 on seed 1 (0.409 against 0.459 at 0.01),
# ten times below the rate that reaches the target soonest on 20 seeds: a race from that anchor
# stepped its rates up three times (804 s, where seeds 0 and 2 took 203-303 s). Why the largest of a
# tie: the rule and the race answer time to a target, which on this model the largest grid rate that
# trains reaches soonest (the critical plan's at batch 32: Adam 0.01, SGD 0.071, nearest 0.1 of the
# grid). The least loss alone chose those in 9 of 12 seeds for each optimizer; the tie, in 12 and 11
# (JAX: 10 and 11 of 12 against 12 and 12; its spread 0.13-0.38).
ANCHOR_TIE = 1.2
# A short run trained, and measured training's gradient, when its final loss is below this share of
# chance's, ln(classes): the anchor's rule (0.98 before 0.28.0 pooled SGD runs at 0.673 and 0.620,
# near chance, as trained, and the noise scale read above the critical batch size measured everywhere)
LEARNED = ANCHOR_LEARNED
# A user's model: the two-batch estimator on ordinary gradients (engine.noise_estimate_at), one
# gradient computation per micro-batch. Micro-batches of 2, 12 to a pair: 16 pairs of 24 images,
# about the article's measurement's images (16 of 25), for 192 gradients a measurement.
USER_NOISE_MICRO = 2
USER_NOISE_MICROS = 12
# A model with BatchNormalization: micro-batches of 8, 6 to a pair (16 pairs of 48 images). A
# micro-batch's gradient is what training computes at that batch size, and BatchNormalization over
# 2 images is nothing like it over training's 32: after a Dense layer it maps any two values to
# about -1 and +1, and the gradient to the layers before it nearly vanishes (0.0003 against 0.169
# at batch 24 in a toy). Over 8 the statistics resemble training's: on a small BatchNormalization
# model the estimator's E|G_32|^2 came within 3% of the one computed directly from batches of 32,
# where micro-batches of 2 were 15% off (tests/measure/test_user_noise.py).
BN_NOISE_MICRO = 8
BN_NOISE_MICROS = 6
# On a CPU the short runs train this many at once, each in a worker of its own: one run of the
# article's model leaves part of two cores idle (its Python between steps runs on one), and the
# runs that do not wait on each other (the rate test's three, then the seeds at the chosen rate)
# took 0.86x (JAX) and 0.94x (TensorFlow) of their time one at a time, workers' starts included
# (benchmarks/bench_noise_workers.py, 64 px, two cores). Each run trains as it would alone, in a
# worker of the same settings and threads: the same numbers. Not on a GPU (two frameworks would
# share its memory), nor for a user's model (its memory is not known before it runs), nor on one core.
NOISE_WORKERS = 3
NOISE_WORKER_ROOM = 2 * 2**30  # host memory available for each worker at once


@dataclass(frozen=True)
class NoiseRun:
    """The noise scale measured before the search: B_simple at the base batch size over epochs
    `from_epoch` to `epochs` of runs at `seeds`, pooled (`estimate`)."""

    estimate: NoiseEstimate
    batch_size: int
    epochs: int = 1
    measure_seconds: float | None = None  # the measurements alone
    seconds: float | None = None  # the whole short run, its worker's start included
    seeds: list[int] | None = None
    from_epoch: int | None = None
    estimator: str | None = None  # a user's model's: "two-batch" (None: the article's per-example products)
    trained: list[int] | None = None  # the seeds whose runs trained, which the estimate pools
    rate_test: dict | None = None  # the anchor's rates and final losses, and the rate chosen (`rate_test`)
    lr: float | None = None  # the rate the runs trained at (`noise_rate`)

    def as_json(self) -> dict:
        """As find_batch_size.json's "noise_scale" holds it."""
        e = self.estimate
        return ({"estimator": self.estimator} if self.estimator else {}) | {"b_simple": e.b_simple, "low": e.low, "high": e.high, "gradient_sq": e.gradient_sq,
                "trace": e.trace, "epochs": self.epochs, "batch_size": self.batch_size, "pairs": e.pairs, "small": e.small,
                "large": e.large, "measure_seconds": self.measure_seconds, "seconds": self.seconds,
                "seeds": self.seeds, "from_epoch": self.from_epoch, "measurements": e.measurements,
                "clustered": True, "trained_seeds": self.trained, "rate_test": self.rate_test, "lr": self.lr} | (
                    {"batch_norm": True} if self.estimator == "two-batch" and e.small == BN_NOISE_MICRO else {})


def noise_sampling() -> NoiseSampling:
    """find-batch-size's measurement: NOISE_PAIRS pairs of NOISE_LARGE images, each its own
    micro-batch, after epochs NOISE_FROM on (none before: they would be discarded)."""
    return NoiseSampling(micro=1, micros=NOISE_LARGE, pairs=NOISE_PAIRS, from_epoch=NOISE_FROM)


def user_noise_sampling(batch_norm: bool = False) -> NoiseSampling:
    """A user's model's measurement: NOISE_PAIRS pairs of USER_NOISE_MICROS micro-batches of
    USER_NOISE_MICRO images (the two-batch estimator), after epochs NOISE_FROM on; with
    BatchNormalization, micro-batches of BN_NOISE_MICRO (the constants say why)."""
    if batch_norm:
        return NoiseSampling(micro=BN_NOISE_MICRO, micros=BN_NOISE_MICROS, pairs=NOISE_PAIRS, from_epoch=NOISE_FROM)
    return NoiseSampling(micro=USER_NOISE_MICRO, micros=USER_NOISE_MICROS, pairs=NOISE_PAIRS, from_epoch=NOISE_FROM)


def measure_noise_scale(data_dir: Path, manifest: dict | None, settings: FindSettings, work: Path, env: dict | None,
                        log: Callable[[str], None], sampling: NoiseSampling | None = None,
                        probe_data: model_check.ProbeData | None = None, worker: Worker | None = None,
                        decoded: str | None = None) -> NoiseRun | None:
    """B_simple past the first epoch's transient: NOISE_SEEDS short runs at the base batch size
    (seeds `settings.seed` and on), each trained NOISE_EPOCHS epochs as a sweep's trial is, those
    that wait on no other at once (`ShortRuns`; `noise_workers`: on a CPU up to three), measured
    after each epoch from NOISE_FROM on (before it, nothing is measured); those measurements
    pooled into one estimate with each seed one cluster weighted alike (gradient_noise.pool_seeds:
    the geometric mean of the seeds' B_simple, Student's interval on their logarithms over the
    seeds). One epoch at one seed moved it from 3 to 296 with the seed and the backend, and two
    seeds pooled pair by pair gave intervals that covered the truth 18% of the time. With the wall
    time (the workers' starts included). None, said in the log, when a run failed. `probe_data`: a user's model (settings.model) trains, on its folder or the
    prepared data, and is measured by the two-batch estimator (`user_noise_sampling`); `worker`:
    the one its check ran in (model_check.check_user_model), ended here as a worker of its own is;
    `decoded`: the prepared data decoded once (probe_run.DecodedCopy), which the runs read."""
    base = default("base_batch_size")
    user = model_check.user_task(settings, probe_data)
    sampling = sampling or (user_noise_sampling() if user else noise_sampling())
    seeds = list(range(settings.seed, settings.seed + NOISE_SEEDS))
    how = (f"the two-batch estimator on ordinary gradients, {sampling.pairs} pairs of {sampling.micros} micro-batches "
           f"of {sampling.micro} images" if user else f"{sampling.pairs} pairs of {sampling.micro} and {sampling.large} images")
    after = (f"epoch {sampling.from_epoch}" if sampling.from_epoch == NOISE_EPOCHS else
             f"epochs {sampling.from_epoch}-{NOISE_EPOCHS}")
    log(f"Noise scale: {NOISE_EPOCHS} epochs at batch size {base}, seeds {', '.join(map(str, seeds))}; B_simple "
        f"from {how} after {after}, each seed one cluster ...")
    rates = None if settings.anchor else [DEFAULT_LR[settings.optimizer] * f for f in (1.0, *RATE_FACTORS)]
    if rates:
        log(_rate_test_line(settings, rates, probe_data))
    chance = math.log(int(probe_data.input_spec[3]) if user and probe_data else 2)  # the class prior's loss
    started = time.perf_counter()
    measured: dict[int, list[NoiseEstimate]] = {}  # the runs that trained; `every`: those of a finite loss
    every: dict[int, list[NoiseEstimate]] = {}
    task = functools.partial(_short_run, settings, manifest, probe_data, data_dir, sampling, env, user,
                             None if user else decoded)
    runs = ShortRuns(task, worker or Worker(work / "noise-scale.log", env),
                     [Worker(work / f"noise-scale-{n}.log", env) for n in range(2, noise_workers(bool(user)) + 1)])
    ran, ahead, run = runs.ran, runs.ahead, runs.run
    try:
        rounds = anchor_rounds(run, rates, seeds, ANCHOR_LEARNED * chance, ahead) if rates else []
        test = rate_test(rates, rounds, ANCHOR_LEARNED * chance, log) if rates else None
        lr = noise_rate(settings, test)
        ahead([(seed, lr) for seed in seeds])
        for seed in seeds:
            record = run(seed, lr)
            later = [NoiseEstimate.from_record(row) for row in record.history or []]
            later = [replace(m, small=sampling.micro, large=sampling.large) for m in later
                     if m is not None and m.epoch >= sampling.from_epoch]
            if record.status != Status.DONE or not later:
                log(f"Noise scale not measured: the short run at seed {seed} {record.status}: "
                    f"{first_line(record.error)} (logs: {', '.join(str(w.log_path) for w in runs.workers)})")
                return None
            loss = final_loss(record)
            if loss is not None:  # a loss that is not finite measured a gradient of NaN, or of a diverged model
                every[seed] = later
            if loss is not None and not record.collapsed and loss < LEARNED * chance:  # it trained: its gradient is training's
                measured[seed] = later
        measure_seconds = sum(ran[seed, lr].noise_seconds or 0.0 for seed in seeds)  # (the estimate's own)
    finally:
        runs.close()
    runs.remove_logs()
    measured = pooled_seeds(measured, every, lr, log)
    estimate = pool_seeds(measured) if measured else None
    if measured and estimate is None:
        log("Noise scale not measured: fewer than two short runs measured one.")
    if estimate is None:
        return None
    return NoiseRun(estimate, base, NOISE_EPOCHS, round(measure_seconds, 2),
                    round(time.perf_counter() - started, 2), seeds=seeds, from_epoch=sampling.from_epoch,
                    estimator="two-batch" if user else None, trained=sorted(measured), lr=lr,
                    rate_test={**test, "noise_seeds": sorted(measured)} if test else None)


def _short_run(settings: FindSettings, manifest: dict | None, probe_data, data_dir: Path, sampling: NoiseSampling,
               env: dict | None, user: dict | None, decoded: str | None, seed: int, lr: float) -> TrialTask:
    """The short run of `seed` at `lr`: 2 epochs at the base batch size, trained as a sweep's trial."""
    config = TrialConfig(settings.optimizer, default("base_batch_size"), settings.dataset, seed, epochs=NOISE_EPOCHS,
                         image_size=manifest["params"]["size"] if manifest else int(probe_data.input_spec[0]),
                         data=manifest["fingerprint"][settings.dataset] if manifest else "",
                         precision=settings.precision, backend=backends.name(), lr=lr,
                         **backends.process_settings(env or {}))
    return TrialTask(config, str(Path(data_dir).resolve()), sampling.as_dict(), user=user, decoded=decoded)


class ShortRuns:
    """The short runs' workers, and each (seed, rate) run once (`ran`): a trial trains alike in any
    worker, so the runs that wait on no other's loss run at once (`ahead`), the first worker (a
    user's model's check's, or a fresh one) and the `extra` ones, launched now to import while the
    first starts."""

    def __init__(self, task: Callable[[int, float], TrialTask], first: Worker, extra: list[Worker]):
        self.task, self.workers = task, [first, *extra]
        for worker in extra:
            worker.launch()
        self.ran: dict[tuple[int, float], TrialRecord] = {}

    def ahead(self, pairs: list[tuple[int, float]]) -> None:
        """The (seed, rate) runs not run yet, at once where the workers allow."""
        todo = list(dict.fromkeys(p for p in pairs if p not in self.ran))
        if todo:
            self.ran.update(run_together(self.workers, [(p, self.task(*p)) for p in todo]))

    def run(self, seed: int, lr: float) -> TrialRecord:
        self.ahead([(seed, lr)])
        return self.ran[seed, lr]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    def remove_logs(self) -> None:
        for worker in self.workers:
            worker.log_path.unlink(missing_ok=True)


def noise_workers(user: bool) -> int:
    """How many short runs train at once: NOISE_WORKERS on a CPU of two cores or more with
    NOISE_WORKER_ROOM of memory available for each, else fewer; one on a GPU, for a user's model,
    on one core (NOISE_WORKERS says why)."""
    if user or visible_gpus() or len(usable_cores()) < 2:
        return 1
    available = host_memory_available()
    return max(1, min(NOISE_WORKERS, NOISE_WORKERS if available is None else available // NOISE_WORKER_ROOM))


def _rate_test_line(settings: FindSettings, rates: list[float], probe_data: model_check.ProbeData | None) -> str:
    which = ("validation loss" if not getattr(probe_data, "own", False) else "training loss (a --data folder "
             "has no validation split)" if probe_data.folder else "training loss (the arrays have no validation split)")
    return (f"Learning rate first: seed {settings.seed} trains at {', '.join(f'{r:g}' for r in rates)}; the largest "
            f"rate whose {which} after {NOISE_EPOCHS} epochs is within {ANCHOR_TIE:g} times the least (one seed "
            f"ranks no closer) anchors the rule, and the noise scale's runs train at it (where none trained, seed "
            f"{settings.seed + 1} tries them).")


def noise_rate(settings: FindSettings, test: dict | None) -> float:
    """The rate the noise scale's runs train at: the one the learning-rate rule anchors on at the
    base batch size (a store's tuned rate carried there by the rule, else the short runs' best,
    else Keras's default). B_simple depends on where training is, and so on its rate: measured at
    Keras's default where the rule anchored at 3-10 times it, SGD's runs sat near chance and the
    scale above the critical batch size measured everywhere (issue 62)."""
    base = default("base_batch_size")
    anchor = settings.anchor or short_run_anchor(test)
    at, lr, _ = anchor_at(base, settings.optimizer, anchor)
    return lr if at == base else learning_rate(settings.optimizer, base, lr, at, None)[0]


def pooled_seeds(trained: dict, finite: dict, rate: float, log: Callable[[str], None]) -> dict:
    """The seeds' measurements the estimate pools: those of the runs that trained; where fewer than
    two did (data too few or too hard for 2 epochs), every run whose loss was finite, an early
    value, said; none (said) where fewer than two losses were finite: a NaN model has no noise scale."""
    if len(finite) < 2:
        log(f"Noise scale not measured: the loss was not finite (NaN or infinite) in {NOISE_SEEDS - len(finite)} of "
            f"the {NOISE_SEEDS} short runs: the model diverges, or computes NaN, at learning rate {rate:g}.")
        return {}
    if len(trained) < 2:
        log(f"Noise scale: {NOISE_SEEDS - len(trained)} of the {NOISE_SEEDS} short runs did not train (collapsed, "
            "diverged, or no better than chance): all are pooled, an early value.")
        return finite
    return trained


def final_loss(record: TrialRecord) -> float | None:
    """A short run's last validation loss (its last training loss where it has no validation
    split, as a --data folder's trial); None when not finite: it diverged."""
    last = (record.history or [{}])[-1]
    value = last.get("val_loss", last.get("loss"))
    return float(value) if value is not None and math.isfinite(value) else None


def anchor_rounds(run: Callable[[int, float], TrialRecord], rates: list, seeds: list[int], learned: float,
                  ahead: Callable[[list[tuple[int, float]]], None] = lambda pairs: None) -> list[dict]:
    """The anchor's runs: the first seed at each of `rates`, the next seed too where none of the
    first's trained, up to ANCHOR_SEEDS. A rate is set at the compiled step's reset: the runs
    share one compiled step, and each measures the noise scale (about 0.2 s), so the one at the
    rate chosen is that seed's noise run. `ahead(pairs)`: a round's (seed, rate) runs, all at
    once, before `run` reads them one by one."""
    rounds = []
    for seed in seeds[:ANCHOR_SEEDS]:
        ahead([(seed, lr) for lr in rates])
        losses = []
        for lr in rates:
            record = run(seed, lr)
            losses.append(final_loss(record) if record.status == Status.DONE and not record.collapsed else None)
        rounds.append({"seed": seed, "losses": losses})
        if _took_off(losses, learned):
            break
    return rounds


def _took_off(losses: list[float | None], learned: float) -> bool:
    """Whether any of a round's runs took off: a final loss (finite, not collapsed) below `learned`."""
    return any(loss is not None and loss < learned for loss in losses)


def rate_test(rates: list, rounds: list[dict], learned: float,
              log: Callable[[str], None] = lambda line: None, tie: float = ANCHOR_TIE) -> dict:
    """What the anchor's short runs say of the learning rate: in the first round (a seed's runs
    at `rates`) where a run trained (its final loss below `learned`), the largest rate whose loss is
    within `tie` of the least ("chosen"; "least" the least's own rate; that round's "seed" and
    "losses"); whether it lies at the grid's edge. None chosen, said, where no run trained in any
    round: a loss at chance ranks no rate. (`tie`: ANCHOR_TIE; 1 ranks by the least loss alone.)"""
    chosen_round = next((r for r in rounds if _took_off(r["losses"], learned)), None)
    chosen = least = None
    if chosen_round is None:
        grid = ", ".join(f"{r:g}" for r in rates)
        log(f"Learning rate: no short run trained at {grid} (seeds {', '.join(str(r['seed']) for r in rounds)}): "
            "the rule is anchored at Keras's default, untuned.")
    else:
        ranked = [(loss, r) for r, loss in zip(rates, chosen_round["losses"], strict=True) if loss is not None]
        least_loss, least = min(ranked)
        # (a ratio of losses needs them positive: a user's loss of 0 or below ties with its equals alone)
        bound = tie * least_loss if least_loss > 0 else least_loss
        chosen = max(r for loss, r in ranked if loss <= bound)
    return {"rates": list(rates), "rounds": rounds, "seed": chosen_round and chosen_round["seed"],
            "losses": chosen_round and chosen_round["losses"], "chosen": chosen, "least": least, "tie": tie,
            "edge": chosen in (rates[0], rates[-1]), "batch_size": default("base_batch_size"),
            "epochs": NOISE_EPOCHS}
