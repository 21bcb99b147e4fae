"""The race run on this device (find-batch-size --race): the sizes that fit, each at its rule's rate
and half and twice it, trained to a validation target on shared seeds, rung by rung, the slower
half left behind at each (catsdogs.measure.race decides what runs; this module runs it). The
answer is measured: the leader, its time with an interval, the sizes it cannot be told from, and
the prediction held against it.

The race's trials are a sweep in the results store, `NAME-race` (catsdogs.training.sweep runs them
on its slots; a user's model with its identity, model_check.Raced): `catsdogs report` and
TensorBoard show it, and Ctrl-C then the same command continues it (the plan, catsdogs.measure.
race_plan, is the sweep's recorded config, not made again from probes that time differently; a
trial is found again by its arm and seed whatever cap it ran under).

- **The target**: `--until`, or the validation loss a reference run reaches at the anchor (the
  base batch size at the rate the learning-rate rule starts from) after REFERENCE_EPOCHS epochs,
  rounded up to 2 digits (so the reference itself reaches it); said with how it was chosen.
- **Evaluations** every `eval_every` training images, the same at every size (a power of two, at
  least EVALUATIONS of them in the reference's epochs), the crossing interpolated between them
  (catsdogs.targets).
- **Time**: T = steps to the target x the size's steady step time, measured in the race's first
  rung (every epoch of a trial after its first, which holds its compilation), the probe's where no
  trial of the size ran a second epoch. Compilation, evaluations and data are fixed costs, measured
  (each trial's wall time less its steady training) and said apart; the decision is on the steady T.
- **Caps**: each rung runs its leader's trials first (the prediction's choice in the first rung),
  then every other arm's, `--workers` at a time, each capped at race.CAP times the best time on
  its seed when it starts (in steps of its size: TrialConfig.max_steps; at most CAPPED_EPOCHS,
  MAX_EPOCHS before any is known); a trial short of the target is censored at the time it trained
  (one stuck at chance, which stops there: at its whole cap, catsdogs.training.curve).
- **A budget** (`--race-budget`): before each rung, and again after its leader's trials, the cost
  of what is left of it is estimated from the trials so far (the median trial's wall time); a rung
  that would pass the budget is not started or not finished, and the answer is the last whole
  rung's, said so (none where the first rung does not fit: the prediction then stands alone).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from catsdogs import targets
from catsdogs.errors import CatsdogsError, Interrupted
from catsdogs.measure.model_check import Raced
from catsdogs.measure.noise_run import ANCHOR_LEARNED
from catsdogs.measure.race import (
    CAP,
    SEEDS_PER_RUNG,
    TIE,
    Arm,
    Outcome,
    Race,
    against_prediction,
)
from catsdogs.measure.race_plan import (
    PLAN_KEYS,
    REFERENCE_EPOCHS,
    identity_of,
    new_plan,
    race_words,
    stored_plan,
)
from catsdogs.schema import Status, TrialConfig
from catsdogs.store import Store, store_path
from catsdogs.training.sweep import SlotFactory, SweepSettings, make_slots, run_sweep, runner_slots

MAX_EPOCHS = 4 * REFERENCE_EPOCHS  # a race trial's cap, in epochs, before any leader's time caps it
CAPPED_EPOCHS = 10 * MAX_EPOCHS  # ... and once one does, at most (a large batch's epochs are few steps)


def sweep_name(name: str) -> str:
    """The race's sweep in the results store: find-batch-size's run name, -race."""
    return f"{name}-race"


def run_race(settings, data_dir: Path, out: Path, manifest: dict | None, size: int, recommendation: dict,
             anchor: dict | None, log, slots: SlotFactory | None = None, raced: Raced | None = None) -> dict:
    """Race the recommendation table's sizes (those that fit under the margin, each with its probe's
    step time) to the target; the race's record, find_batch_size.json's `race`. `settings`:
    find-batch-size's (FindSettings); `anchor`: the learning-rate anchor the recommendation used;
    `slots`: where the trials run (the sweep's SlotFactory; None: worker processes here); `raced`:
    the model and data (model_check.Raced; None: the article's model on the prepared data)."""
    started = time.perf_counter()
    sweep = sweep_name(settings.name)
    raced = raced or Raced.of(settings, manifest, None, None)
    identity = identity_of(settings, raced, size)
    plan = stored_plan(out, sweep, identity, log) or new_plan(settings, raced, recommendation, anchor, identity)
    slots, workers = runner_slots(settings.race_runner, slots, settings.race_workers, ray_address=settings.ray_address,
                                  env=settings.environment(), log=log)  # (--runner ray: Ray's actors)
    kept = make_slots(out, SweepSettings(workers=workers, worker_env=settings.environment(), slots=slots))
    runner = _Runner(sweep, plan, settings, data_dir, out, kept, workers, log, raced)
    try:
        if plan["target"] is None:
            runner.reference()
        log(f"Race to {race_words(plan)}, on seeds {plan['seeds'][0]}-{plan['seeds'][-1]} "
            f"by rungs of {', '.join(map(str, SEEDS_PER_RUNG))} seeds (sweep {sweep} in {store_path(out)}).")
        race, stopped = runner.run(started)
    except KeyboardInterrupt:
        log(f"Interrupted: the race's finished trials are in {store_path(out)} (sweep {sweep}); the same command "
            "continues it.")
        raise Interrupted() from None
    finally:
        for slot in kept:
            slot.close()
    return _record(race, plan, runner, recommendation, stopped, time.perf_counter() - started)


# --- running it ------------------------------------------------------------------------------------


class _Runner:
    """Runs the race's waves as sweeps on kept slots and reads their outcomes back from the store."""

    def __init__(self, sweep: str, plan: dict, settings, data_dir: Path, out: Path, slots, workers: int, log,
                 raced: Raced):
        self.sweep, self.plan, self.settings, self.data_dir, self.out = sweep, plan, settings, data_dir, out
        self.slots, self.workers, self.log, self.raced = slots, workers, log, raced
        self.grid: list[TrialConfig] = []  # every trial of the race so far, in the order run
        self.walls: dict[str, float] = {}  # each trial's wall seconds, by key (the budget's estimates)
        self.said: set[str] = set()  # the failed trials said so far

    # -- trials --

    def config(self, batch_size: int, lr: float, seed: int, epochs: int, max_steps: int | None = None,
               target: bool = True) -> TrialConfig:
        i, until = self.plan["identity"], self.plan["target"] if target else None
        return TrialConfig(i["optimizer"], batch_size, i["dataset"], seed, epochs=epochs, image_size=i["image_size"],
                           data=i["data"], lr=lr, precision=i["precision"], until=until,
                           eval_every=self.plan["eval_every"] if until else None, deterministic=i["deterministic"],
                           tf32=i["tf32"], backend=i["backend"], model=i.get("model"), max_steps=max_steps,
                           stop_at_chance=until is not None)

    def run_wave(self, configs: list[TrialConfig]) -> None:
        """One sweep call over the race's trials so far, of which `configs` are new; the sweep's own
        lines but its opening and closing ones (the race says its own)."""
        if not configs:
            return
        self.grid += configs
        quiet = (f"Sweep {self.sweep}:", f"Sweep {self.sweep} finished", "    epoch ")  # (a trial's own lines stay)
        settings = SweepSettings(workers=self.workers, eval_every=self.plan["eval_every"],
                                 sweep_config={"race": self.plan, "find_batch_size": self.settings.name},
                                 user=self.raced.task,
                                 log=lambda line: None if line.startswith(quiet) else self.log(line))
        run_sweep(self.sweep, self.grid, self.data_dir, self.out, settings, kept=self.slots)

    def finished(self) -> dict[tuple[int, float, int], dict]:
        """The race's finished trials in the store, by (batch size, rate, seed), whatever cap they ran under."""
        if not store_path(self.out).exists():
            return {}
        with Store(store_path(self.out), read_only=True) as store:
            rows = store.trials(self.sweep)
        until, i = self.plan["target"], self.plan["identity"]
        same = [k for k in PLAN_KEYS if k not in ("seed", "until")]  # (a trial's own seed; its target: `until`)
        found = {}
        for row in rows:
            c = row["config"]
            if row["status"] in (Status.DONE, Status.FAILED, Status.OOM) and c.get("until") == until \
                    and c.get("eval_every") == self.plan["eval_every"] and all(c.get(k) == i[k] for k in same):
                found[(c["batch_size"], c["lr"], c["seed"])] = row
        return found

    def reference(self) -> None:
        """The reference run at the anchor, whose validation loss after REFERENCE_EPOCHS epochs is the
        target; recorded in the plan (the sweep's config) so that a continued race keeps it."""
        a = self.plan["anchor"]
        cfg = self.config(a["batch_size"], a["lr"], self.plan["seeds"][0], REFERENCE_EPOCHS, target=False)
        self.log(f"Race: the target first, from a reference run of batch size {a['batch_size']} at "
                 f"{a['lr']:g} ({a['said']}) for {REFERENCE_EPOCHS} epochs.")
        self.run_wave([cfg])
        with Store(store_path(self.out), read_only=True) as store:
            row = store.get(cfg.key())
        history = (row or {}).get("history") or []
        loss = history[-1].get("val_loss") if history else None
        if row is None or row["status"] != Status.DONE or loss is None or not math.isfinite(loss) \
                or loss >= ANCHOR_LEARNED * math.log(self.raced.classes):  # (the noise runs' rule: it took off)
            why = (f"its validation loss after {REFERENCE_EPOCHS} epochs is {loss:.3f}, not below {ANCHOR_LEARNED:g} "
                   f"ln {self.raced.classes} = {ANCHOR_LEARNED * math.log(self.raced.classes):.3f}, off chance"
                   if loss is not None and math.isfinite(loss) else f"it ended {(row or {}).get('status')}")
            raise CatsdogsError(f"the race has no target: the reference run (batch size {a['batch_size']} at "
                                f"{a['lr']:g}) did not learn ({why}); give one with --until METRIC=VALUE")
        self.plan["target"] = targets.canonical(f"val_loss={math.ceil(loss * 100) / 100:.2f}")
        self.plan["target_said"] = (f"the validation loss batch size {a['batch_size']} at {a['lr']:g} reached "
                                    f"after {REFERENCE_EPOCHS} epochs, {loss:.4f}, rounded up")
        self.plan["reference"] = {"batch_size": a["batch_size"], "lr": a["lr"], "seed": self.plan["seeds"][0],
                                  "epochs": REFERENCE_EPOCHS, "val_loss": loss, "wall_seconds": row.get("wall_seconds")}
        if row.get("wall_seconds"):
            self.walls[row["key"]] = row["wall_seconds"]

    # -- times --

    def per_epoch(self, batch_size: int) -> int:
        return max(1, self.plan["n_train"] // batch_size)

    def step_seconds(self, batch_size: int) -> float:
        steady = self.plan.get("steady_step_seconds") or {}
        return steady.get(str(batch_size)) or self.plan["probe_step_seconds"][str(batch_size)]

    def freeze_steady(self, rows: list[dict]) -> None:
        """Each size's steady step time from the first rung: the epochs after each trial's first (its
        compilation), the median over its trials; where none ran two, the probe's times the sizes'
        median ratio of the two (trials' steps took 4-20% longer than probes': the probe's alone
        favoured small sizes, done in one epoch). In the plan: every later decision reads it."""
        per: dict[int, list[float]] = {}
        for row in rows:
            history = row.get("history") or []
            later = [(e.get("train_seconds", e.get("seconds")), e.get("batches", self.per_epoch(row["config"]["batch_size"])))
                     for e in history[1:] if e.get("train_seconds", e.get("seconds"))]  # (an epoch's seconds hold its validation)
            batches = sum(b for _, b in later)
            if batches:
                per.setdefault(row["config"]["batch_size"], []).append(sum(s for s, _ in later) / batches)
        probe = {int(b): t for b, t in self.plan["probe_step_seconds"].items()}
        scale = statistics.median([statistics.median(v) / probe[b] for b, v in per.items()]) if per else 1.0
        self.plan["steady_step_seconds"] = {str(b): statistics.median(per[b]) if per.get(b) else probe[b] * scale
                                            for b in self.plan["sizes"]}
        self.plan["steady_from"] = {str(b): "race" if per.get(b) else f"probe x {scale:.3g}" for b in self.plan["sizes"]}

    def outcome(self, arm: Arm, seed: int, row: dict) -> Outcome:
        """A trial's steady time to the target, or censored at the steady time it trained (stuck at chance: its cap)."""
        b, step = arm.batch_size, self.step_seconds(arm.batch_size)
        reached = row["status"] == Status.DONE and row.get("target_reached") == 1
        stuck = not reached and bool((row.get("curve") or [{}])[-1].get("stuck"))
        if (row["status"] != Status.DONE or stuck) and row["key"] not in self.said:  # (said once)
            self.said.add(row["key"])
            why = "sat at chance for an epoch" if stuck else (row.get("error") or "no error kept").splitlines()[0][:120]
            self.log(f"Race: {arm} on seed {seed} {'stopped' if stuck else row['status']} ({why}): counted as short "
                     f"of the target{' at its whole cap' if stuck else ''}")
        allowed = min(row["config"].get("epochs", MAX_EPOCHS) * self.per_epoch(b), row["config"].get("max_steps") or math.inf)
        steps = (row.get("steps_to_target") or 0.0) if reached else allowed if stuck else row.get("steps") or allowed
        return Outcome(arm, seed, max(steps, 1.0) * step, censored=not reached)

    def fixed_seconds(self) -> dict[str, float]:
        """Per size, the median over its race trials of their fixed seconds: the wall time less the
        steady training (compilation, evaluations, data, the worker's hand-over)."""
        fixed: dict[int, list[float]] = {}
        for row in self.finished().values():
            b = row["config"]["batch_size"]
            if row.get("wall_seconds") and str(b) in self.plan["probe_step_seconds"]:
                fixed.setdefault(b, []).append(max(0.0, row["wall_seconds"] - (row.get("steps") or 0) * self.step_seconds(b)))
        return {str(b): round(statistics.median(v), 3) for b, v in sorted(fixed.items())}

    def capped(self, batch_size: int, cap: float | None) -> tuple[int, int | None]:
        """A cap in seconds as (epochs, steps): the steps of this size's steady step time that reach it
        (a censored trial trained at least its cap) and the epochs they fall in, at most
        CAPPED_EPOCHS (steps None where the cap is those epochs' end); (MAX_EPOCHS, None) where none is known."""
        if cap is None:
            return MAX_EPOCHS, None
        per = self.per_epoch(batch_size)
        steps = max(1, math.ceil(cap / self.step_seconds(batch_size)))
        epochs = min(CAPPED_EPOCHS, math.ceil(steps / per))
        return epochs, (steps if steps < epochs * per else None)

    # -- the rungs --

    def run(self, started: float) -> tuple[Race | None, dict]:
        """Every rung, the leader's trials first then the rest capped by them; the race as its last
        whole rung left it (None: none finished) and how it stopped: {"by": "finished"} or
        {"by": "budget", ...}."""
        plan = self.plan
        arms = [Arm(b, lr) for b in plan["sizes"] for lr in plan["rates"][str(b)]]
        race = Race(arms, seeds=list(plan["seeds"]))
        rates_of = {b: list(plan["rates"][str(b)]) for b in plan["sizes"]}
        first = Arm(plan["first"]["batch_size"], plan["first"]["lr"])
        whole = None  # the race as its last whole rung left it
        before = None  # the race before its edge's latest rate began to climb the rungs (a cut then answers with it)
        while True:
            while not race.finished:
                trials = race.next_trials()
                cut = self.over_budget(started, self.to_run(trials), race)
                if cut:
                    return before if race.stepping else whole, cut
                self.log(f"Race, rung {race.rung + 1} of {len(race.rungs)}: {len(race.alive)} arm"
                         f"{'s' if len(race.alive) != 1 else ''} on {len(race.rung_seeds())} seeds ({len(trials)} trials).")
                lead = first if race.rung == 0 and first in race.alive else race.leader() if race.outcomes else race.alive[0]
                self.wave(race, [t for t in trials if t.arm == lead])
                rest = [t for t in trials if t.arm != lead]
                cut = self.over_budget(started, self.to_run(rest), race)  # (the first rung's, where no run came before it)
                if cut:
                    return before if race.stepping else whole, cut
                self.wave(race, rest)
                done = self.finished()
                if plan.get("steady_step_seconds") is None:
                    self.freeze_steady(list(done.values()))
                for (arm, seed) in list(race.outcomes):  # every outcome read with the steady step times
                    race.record(self.outcome(arm, seed, done[(arm.batch_size, arm.lr, seed)]))
                left = race.advance()
                if left:
                    self.log(f"Race: {', '.join(map(str, left))} left behind (slower by their times' geometric mean, "
                             "or beaten: short of the target on every seed so far, or clearly over 1.25 times the leader).")
                whole = race.copy()
            before = race.copy()
            step = race.extend_edge(rates_of)  # (again while a winner is at its set's edge, as the oracle has it)
            if step is None:
                break
            self.log(f"Race: the leader's rate is at its set's edge: {step} climbs the rungs, left behind where beaten.")
        return race, {"by": "finished"}

    def wave(self, race: Race, trials) -> None:
        """Trials whose (arm, seed) the store holds already are read back; the rest run an arm at a time
        (as many as keep `workers` busy), the likeliest fastest first (by its times so far, then its
        size's and rate's nearness to the leader's and the rule's), each capped at CAP times the best
        time on its seed when it starts, as race.Race has it (not the leader's time alone)."""
        done = self.finished()
        pending = [t for t in trials if (t.arm.batch_size, t.arm.lr, t.seed) not in done]
        for t in (t for t in trials if t not in pending):
            self.take(race, t, done[(t.arm.batch_size, t.arm.lr, t.seed)])
        lead = race.leader() if race.outcomes else race.alive[0]
        rule = {int(b): statistics.median(rates) for b, rates in self.plan["rates"].items()}
        while pending:
            ranked = sorted({t.arm for t in pending}, key=lambda a: (race.log_time(a), abs(math.log(a.batch_size / lead.batch_size)),
                                                                     abs(math.log(a.lr / rule.get(a.batch_size, a.lr))), a))
            arms = next(ranked[:n] for n in range(1, len(ranked) + 1)  # (enough arms to keep every worker busy)
                        if n == len(ranked) or sum(t.arm in ranked[:n] for t in pending) >= self.workers)
            tier, pending = [t for t in pending if t.arm in arms], [t for t in pending if t.arm not in arms]
            configs = [self.config(t.arm.batch_size, t.arm.lr, t.seed, *self.capped(t.arm.batch_size, race.cap_for(t.seed)))
                       for t in tier]
            self.run_wave(configs)
            with Store(store_path(self.out), read_only=True) as store:
                for t, cfg in zip(tier, configs, strict=True):
                    self.take(race, t, store.get(cfg.key()))

    def take(self, race: Race, t, row: dict | None) -> None:  # (a trial's outcome into the race)
        if row is None or row["status"] not in (Status.DONE, Status.FAILED, Status.OOM):  # (another live sweep's, or lost)
            raise CatsdogsError(f"the race's trial {t.arm} on seed {t.seed} did not finish (another run of "
                                f"{self.sweep!r} may hold it): run the same command again")
        if row.get("wall_seconds"):
            self.walls[row["key"]] = row["wall_seconds"]
        race.record(self.outcome(t.arm, t.seed, row))

    def to_run(self, trials) -> int:  # how many of `trials` the store does not hold yet (a continued race runs only those)
        done = self.finished()
        return sum((t.arm.batch_size, t.arm.lr, t.seed) not in done for t in trials)

    def over_budget(self, started: float, trials: int, race: Race) -> dict | None:
        """Where the rung about to start (an edge's rate's, where one climbs) would pass --race-budget:
        how the race stopped."""
        budget = self.settings.race_budget
        if budget is None or not self.walls or not trials:
            return None
        elapsed = time.perf_counter() - started
        estimate = math.ceil(trials / self.workers) * statistics.median(self.walls.values())
        if elapsed + estimate <= budget:
            return None
        rung, step = race.rung, race.stepping
        answer = "the race's without it" if step else f"rung {rung}'s" if rung else "none, no rung having finished"
        where = f"{step} at its rates' edge, " if step else ""
        self.log(f"Race: {where}rung {rung + 1} ({trials} trials more, about "
                 f"{estimate:.0f} s) would pass the budget of {budget:g} s ({elapsed:.0f} s spent): the answer is {answer}.")
        return {"by": "budget", "budget_seconds": budget, "rungs_finished": len(race.rungs) if step else rung,
                "estimate_seconds": round(estimate, 1), **({"extension_skipped": str(step)} if step else {})}


# --- the record ------------------------------------------------------------------------------------


def _record(race: Race | None, plan: dict, runner: _Runner, recommendation: dict, stopped: dict, seconds: float) -> dict:
    """find_batch_size.json's `race`: the plan, how it stopped, the decision, the fixed costs, and
    the prediction's recommendation held against the measured answer."""
    decision = race.decision() if race is not None else None
    fixed = runner.fixed_seconds()
    record = {"target": plan["target"], "target_said": plan["target_said"], "reference": plan.get("reference"),
              "eval_every": plan["eval_every"], "sizes": plan["sizes"], "rates": _rates(race, plan),
              "seeds": plan["seeds"], "rungs": list(SEEDS_PER_RUNG), "cap": CAP, "tie": TIE,
              "steady_step_seconds": plan.get("steady_step_seconds"), "steady_from": plan.get("steady_from"),
              "probe_step_seconds": plan["probe_step_seconds"], "fixed_seconds": fixed,
              "trials": len(runner.finished()), "seconds": round(seconds, 1), "stopped": stopped,
              "sweep": runner.sweep, "decision": decision, "prediction": None}
    if decision is not None:
        record["prediction"] = against_prediction(decision, recommendation["batch_size"])
    return record


def _rates(race: Race | None, plan: dict) -> dict:
    """Each size's rates raced: the plan's, and an edge's extra ones where they raced."""
    rates = {b: set(lrs) for b, lrs in plan["rates"].items()}
    for arm in race.arms if race is not None else ():
        rates.setdefault(str(arm.batch_size), set()).add(arm.lr)
    return {b: sorted(lrs) for b, lrs in rates.items()}
