"""The race run (catsdogs.measure.race_run) on simulated devices: its trials are a sweep's in the
store, run on slots that train nothing (fakes.RaceSlot), so what it decides, resumes, cuts and
records is tested apart from training (find-batch-size --race end to end: tests/surfaces)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from fakes import RaceDevice, RaceSlot

from catsdogs.errors import CatsdogsError, Interrupted, SettingError
from catsdogs.find_result import FindResult
from catsdogs.manifest import require_prepared
from catsdogs.measure import race_run
from catsdogs.measure.find_summary import race_lines
from catsdogs.measure.model_check import Raced
from catsdogs.measure.race import Arm
from catsdogs.measure.race_plan import new_plan
from catsdogs.measure.race_run import (
    MAX_EPOCHS,
    _Runner,
    against_prediction,
    run_race,
    sweep_name,
)
from catsdogs.measure.settings import FindSettings
from catsdogs.store import Store, store_path

STEPS = {1: 0.002, 2: 0.0025, 4: 0.003, 8: 0.004, 16: 0.006, 32: 0.01, 64: 0.018}
LOG_SD = dict.fromkeys(STEPS, 0.4)
ANCHOR = {"kind": "short-run", "rates": {32: 0.01}, "edges": [], "said": "a test's anchor"}  # SGD's linear rule: RaceDevice's


def recommendation(predicted: int = 32) -> dict:
    return {"batch_size": predicted, "statistics": "open above", "b_noise": None,
            "table": [{"batch_size": b, "step_seconds": s} for b, s in STEPS.items()]}


def race(tmp_path, data, device, *, until="val_loss=0.5", budget=None, predicted=32, ran=None, interrupt_after=None,
         fixed=0.5, name="fbs", lines=None, slower=lambda seed: 1.0, raced=None, users=None):
    """The race on `device`, its clock the trials' simulated wall seconds (what --race-budget reads)."""
    settings = FindSettings(name=name, optimizer="sgd", race=True, until=until, race_budget=budget)
    manifest = require_prepared(data)
    n_train = raced.train_images if raced else sum(manifest["counts"]["standard"]["train"].values())
    clock = [0.0]
    slots = lambda i, n, workdir: RaceSlot(device, n_train, fixed=fixed, ran=ran, interrupt_after=interrupt_after,  # noqa: E731
                                           slower=slower, users=users, clock=clock)
    log = lines.append if lines is not None else (lambda line: None)
    with mock.patch.object(race_run, "time", SimpleNamespace(perf_counter=lambda: clock[0])):
        return run_race(settings, data, tmp_path, manifest, 32, recommendation(predicted), ANCHOR, log, slots=slots,
                        raced=raced)


@pytest.fixture
def data(prepared_data):
    return prepared_data(32, (64, 8, 8))  # 128 training images: every size has whole epochs


def true_best(device: RaceDevice, record: dict) -> tuple[float, float]:
    """(the answer's true median time, the least over every arm raced)."""
    d = record["decision"]
    arms = [(int(b), lr) for b, rates in record["rates"].items() for lr in rates]
    return device.median_seconds(d["batch_size"], d["lr"]), min(device.median_seconds(b, lr) for b, lr in arms)


def test_a_race_answers_within_its_tie_of_the_true_best_and_records_its_trials_as_a_sweep(tmp_path, data):
    # given a device whose best is batch 8 (B_noise 8: steps fall slowly past it, step times grow)
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    ran: list = []
    # when the race runs
    record = race(tmp_path, data, device, ran=ran)
    # then its answer's true time is within 1.25 times the best arm's
    answer, best = true_best(device, record)
    assert answer <= 1.25 * best
    # and every trial it decided on is in the store, under the race's sweep, once
    with Store(store_path(tmp_path), read_only=True) as store:
        stored = store.trials(sweep_name("fbs"))
    assert len(stored) == len(ran) == record["trials"]
    assert len({(c.batch_size, c.lr, c.seed) for c in ran}) == len(ran)
    assert record["stopped"] == {"by": "finished"} and record["decision"]["seeds"] == 18


# docs/gpu.md, the H200's critical check (0.25.0): seconds a step by batch size, and a trial's fixed
# cost (a fit of T = F + S c r(B) over its trials: compilation, evaluations, data)
H200_STEPS = {4: 0.0037, 8: 0.0074, 16: 0.0099, 32: 0.0145, 64: 0.0133, 128: 0.0117}
H200_FIXED = 0.52


def h200_race(out, data, b_noise: float, seed: int = 0) -> tuple[RaceDevice, dict, float]:
    """(the device, the race's record, its trials' simulated seconds) of a race on the H200's
    recorded step times and fixed cost, the critical plan's seed spreads (log sd 1.12 at 4 to 0.38
    at 128), from 0.25.0's prediction (128: its miss where a small size was fastest)."""
    device = RaceDevice(H200_STEPS, b_noise=b_noise, log_sd={b: 0.38 + 0.74 * (4 / b) ** 0.5 for b in H200_STEPS},
                        seed=seed)
    rec = {"batch_size": 128, "statistics": "open above", "b_noise": None,
           "table": [{"batch_size": b, "step_seconds": t} for b, t in H200_STEPS.items()]}
    settings = FindSettings(name="h200", optimizer="sgd", race=True, until="val_loss=0.5", seed=seed)
    manifest = require_prepared(data)
    n_train = sum(manifest["counts"]["standard"]["train"].values())
    slots = lambda i, n, workdir: RaceSlot(device, n_train, fixed=H200_FIXED)  # noqa: E731
    record = run_race(settings, data, out, manifest, 32, rec, ANCHOR, lambda line: None, slots=slots)
    with Store(store_path(out), read_only=True) as store:
        seconds = sum(t["wall_seconds"] for t in store.trials(sweep_name("h200")))
    return device, record, seconds


@pytest.mark.xdist_group("h200-race")  # one test process prepares the 1,232 images (10 s), not both
@pytest.mark.parametrize("b_noise", [8.0, 64.0], ids=["a-small-size-best", "128-best"])
def test_on_the_h200s_recorded_step_times_and_fixed_cost_the_race_answers_within_its_tie(tmp_path, prepared_data,
                                                                                        b_noise):
    # given the H200's step times and fixed cost on the article's 1,200 training images
    data = prepared_data(32, (600, 8, 8))
    # when the race runs its scheduler on them, from the prediction's 128
    device, record, seconds = h200_race(tmp_path, data, b_noise)
    # then the answer's true time is within 1.25 times the best arm's, whatever the prediction said
    answer, best = true_best(device, record)
    assert answer <= 1.25 * best
    # and its trials' simulated seconds hold each trial's fixed cost beside its training
    # (benchmarks/sim_race_h200.py prints them over seeds; not bounded here)
    assert seconds > H200_FIXED * record["trials"]


@pytest.mark.parametrize("stop_after", [30, 55], ids=["in-the-first-rung", "after-its-step-times-were-fixed"])
def test_a_race_interrupted_continues_where_it_stopped_and_answers_as_an_uninterrupted_one(tmp_path, data,
                                                                                          stop_after):
    # given trials whose own step times differ from the probes' and by seed (the first rung fixes
    # each size's steady time from them), a race run whole, and the same race stopped by Ctrl-C
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    slower = lambda seed: 1.0 + 0.15 * (seed % 3)  # noqa: E731
    whole = race(tmp_path / "whole", data, device, slower=slower)
    first: list = []
    with pytest.raises(Interrupted):
        race(tmp_path / "cut", data, device, ran=first, interrupt_after=stop_after, slower=slower)
    # when the same command runs again
    second: list = []
    lines: list = []
    again = race(tmp_path / "cut", data, device, ran=second, lines=lines, slower=slower)
    # then it continues the recorded race: no trial runs twice, and the answer is the whole race's
    assert any("continuing the race" in line for line in lines)
    done_first = {(c.batch_size, c.lr, c.seed) for c in first[:stop_after - 1]}  # (the last was given back)
    assert not done_first & {(c.batch_size, c.lr, c.seed) for c in second}
    assert again["decision"] == whole["decision"] and again["steady_step_seconds"] == whole["steady_step_seconds"]
    assert whole["steady_step_seconds"] != whole["probe_step_seconds"]


def test_a_budget_stops_the_race_at_its_last_whole_rung_and_says_so(tmp_path, data):
    # given trials of 100 s each (their wall time): the first rung (21 arms on 2 seeds) costs about 4,200 s, the second 4,400
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    # when the budget holds the first rung (its leader's 2 trials, then 40 more) but not the second
    record = race(tmp_path, data, device, budget=4300, fixed=100.0)
    # then the race stops after the first rung, answering from its 2 seeds
    assert record["stopped"]["by"] == "budget" and record["stopped"]["rungs_finished"] == 1
    assert record["decision"]["seeds"] == 2
    assert any("Stopped by --race-budget" in line for line in race_lines(record))


def test_a_budget_below_the_first_rung_races_nothing_and_leaves_the_prediction_alone(tmp_path, data):
    # given trials of 100 s each, and a budget of 1,000 s: the first rung's 40 trials after its leader's would pass it
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    record = race(tmp_path, data, device, budget=1000, fixed=100.0)
    # then no rung finished, and there is no measured answer
    assert record["stopped"]["rungs_finished"] == 0 and record["decision"] is None
    assert any("the prediction stands alone" in line for line in race_lines(record))
    assert any("before its first rung would finish" in line for line in race_lines(record))
    assert not any("the answer is theirs" in line for line in race_lines(record))  # (there is none)


def test_a_trial_short_of_the_target_is_censored_at_the_time_it_trained(tmp_path, data):
    # given a device on which batch 64 needs far more steps than any cap gives it
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD, best_factor={64: 64.0})
    # when raced
    record = race(tmp_path, data, device)
    # then batch 64's runs are censored, none counted as reaching the target
    rows = [r for r in record["decision"]["arms"] if r["batch_size"] == 64]
    assert rows and all(r["censored"] == r["seeds"] for r in rows)


def test_a_capped_trial_stops_at_its_caps_step_within_the_epoch_it_falls_in(tmp_path, data):
    # given a race on 128 training images (batch 2: 64 steps an epoch)
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    ran: list = []
    # when raced
    race(tmp_path, data, device, ran=ran)
    # then a trial capped within an epoch carries its cap's step inside its last epoch (not that
    # epoch's end), and one short of the target stopped there, no step past it
    capped = [c for c in ran if c.max_steps]
    assert capped and all((c.epochs - 1) * (128 // c.batch_size) < c.max_steps < c.epochs * (128 // c.batch_size)
                          for c in capped)
    with Store(store_path(tmp_path), read_only=True) as store:
        stored = {t["key"]: t for t in store.trials(sweep_name("fbs"))}
    short = [c for c in capped if not stored[c.key()]["target_reached"]]
    assert short and all(stored[c.key()]["steps"] == c.max_steps for c in short)


def test_every_trial_starts_capped_by_the_best_time_on_its_seed_so_far_not_the_leaders_alone(tmp_path, data):
    # given a device on which the prediction's arm (32 at its rule's rate, racing first) is far from
    # its size's best rate, so that other arms beat it on every seed
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD, best_factor={32: 8.0})
    ran: list = []
    # when raced
    race(tmp_path, data, device, ran=ran)
    with Store(store_path(tmp_path), read_only=True) as store:
        stored = {t["key"]: t for t in store.trials(sweep_name("fbs"))}
    # then each trial may train at most 3 times the best time on its seed among the trials before it
    best: dict[int, float] = {}
    tighter = 0
    for c in ran:
        row, step = stored[c.key()], STEPS[c.batch_size]
        if c.seed in best:
            allowed = c.max_steps or c.epochs * (128 // c.batch_size)
            assert allowed <= math.ceil(3 * best[c.seed] / step), (c.label(), allowed, best[c.seed])
        if row["target_reached"]:
            seconds = max(row["steps_to_target"], 1.0) * step
            tighter += c.seed in best and seconds < best[c.seed]
            best[c.seed] = min(best.get(c.seed, math.inf), seconds)
    # and arms after the leader did beat it, so caps tightened as they ran
    assert tighter > 0


def test_the_default_target_is_the_reference_runs_loss_after_its_epochs_rounded_up(tmp_path, data):
    # given no --until: the reference run's validation loss after 3 epochs is 0.503
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    lines: list = []
    record = race(tmp_path, data, device, until=None, lines=lines)
    # then the target is 0.51, said with how it was chosen
    assert record["target"] == "val_loss=0.51"
    assert "reached after 3 epochs, 0.5030, rounded up" in record["target_said"]
    assert record["reference"]["batch_size"] == 32 and record["reference"]["lr"] == 0.01


def test_a_reference_run_that_does_not_leave_chance_is_one_line_naming_until(tmp_path, data, monkeypatch):
    monkeypatch.setattr(RaceSlot, "REFERENCE_LOSSES", (0.7, 0.69, 0.68))
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    with pytest.raises(CatsdogsError, match="did not learn.*--until"):
        race(tmp_path, data, device, until=None)


def test_a_stored_race_of_other_settings_is_refused_in_one_line(tmp_path, data):
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    race(tmp_path, data, device, budget=4300, fixed=100.0)  # (one rung: quick)
    with pytest.raises(CatsdogsError, match="other settings \\(until\\).*another --name"):
        race(tmp_path, data, device, until="val_loss=0.4", budget=4300, fixed=100.0)


def test_a_sweep_of_the_races_name_that_is_not_a_race_is_refused_and_left_as_it_was(tmp_path, data):
    # given a sweep of the user's named as the race would be
    from dataclasses import asdict

    from catsdogs.schema import TrialConfig

    with Store(store_path(tmp_path)) as store:
        store.register_sweep(sweep_name("fbs"), {"plan": "mine"}, [asdict(TrialConfig("sgd", 8, "standard", 0))])
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    # then the race refuses it in one line, and the sweep keeps its config and its one trial
    with pytest.raises(CatsdogsError, match="holds a sweep named 'fbs-race' that is not a race"):
        race(tmp_path, data, device)
    with Store(store_path(tmp_path), read_only=True) as store:
        assert store.sweep_config(sweep_name("fbs")) == {"plan": "mine"} and len(store.trials(sweep_name("fbs"))) == 1


def test_a_size_no_trial_of_which_ran_a_second_epoch_takes_its_probes_step_time_scaled_as_the_others_were(data):
    # given trials of 16 whose steps took 1.3 times their probe's, and of 8, done in one epoch each
    plan = {"n_train": 128, "sizes": [8, 16], "probe_step_seconds": {"8": 0.004, "16": 0.006}}
    runner = _Runner("s", plan, None, data, data, [], 1, print, None)
    rows = [{"config": {"batch_size": 16}, "history": [{"train_seconds": 1.0}, {"train_seconds": 8 * 0.0078}]},
            {"config": {"batch_size": 8}, "history": [{"train_seconds": 0.5}]}]
    # when the steady step times are fixed
    runner.freeze_steady(rows)
    # then 16's is its trials' own, and 8's its probe's times the same 1.3
    assert plan["steady_step_seconds"]["16"] == pytest.approx(0.0078)
    assert plan["steady_step_seconds"]["8"] == pytest.approx(0.004 * 1.3) and plan["steady_from"]["8"] == "probe x 1.3"


def test_a_cap_becomes_the_steps_that_reach_it_in_the_epochs_they_fall_in(tmp_path, data):
    # given batch 64 (2 steps an epoch of 128 images, 0.018 s a step) and batch 1 (128 steps an
    # epoch, 0.01 s a step)
    runner = _Runner("s", {"n_train": 128, "probe_step_seconds": {"64": 0.018, "1": 0.01}}, None, data, tmp_path,
                     [], 1, print, None)
    # then a cap of 2 s trains 64 for 56 epochs (2 / 0.036, rounded up), past the uncapped 12, whose
    # end is the cap (no step cap); none without a cap
    assert runner.capped(64, 2.0) == (56, None) and 56 > MAX_EPOCHS
    assert runner.capped(64, None) == (MAX_EPOCHS, None)
    # and a cap of 0.5 s stops batch 1 at its 50th step, within its first epoch, where whole epochs
    # trained all 128; a cap of 1.5 s at its 150th, in its second
    assert runner.capped(1, 0.5) == (1, 50)
    assert runner.capped(1, 1.5) == (2, 150)


def test_a_trial_stuck_at_chance_counts_short_of_the_target_at_its_whole_cap_and_says_so(tmp_path, data):
    # given batch 32 (4 steps an epoch of 128 images, 0.01 s a step) run uncapped for 12 epochs, and
    # two of its trials stopped after 5 steps: one stuck at chance, one at its step cap
    lines: list = []
    runner = _Runner("s", {"n_train": 128, "probe_step_seconds": {"32": 0.01}}, None, data, tmp_path,
                     [], 1, lines.append, None)
    arm = Arm(32, 0.01)
    stuck = {"key": "a", "status": "done", "target_reached": 0, "steps": 5, "config": {"batch_size": 32, "epochs": 12},
             "curve": [{"step": 5, "val_loss": 0.693, "val_accuracy": 0.5, "stuck": True}]}
    capped = {**stuck, "key": "b", "config": {"batch_size": 32, "epochs": 2, "max_steps": 5}, "curve": [{"step": 5}]}
    # when their outcomes are read
    at_chance, short = runner.outcome(arm, 1, stuck), runner.outcome(arm, 2, capped)
    # then the stuck one is censored at the whole 12 epochs it was given (48 steps), where it would have
    # stayed, and said once; the capped one at the 5 steps it trained
    assert at_chance.censored and at_chance.seconds == pytest.approx(48 * 0.01)
    assert short.censored and short.seconds == pytest.approx(5 * 0.01)
    runner.outcome(arm, 1, stuck)
    assert len([line for line in lines if "sat at chance" in line]) == 1


def test_a_race_stops_its_trials_stuck_at_chance_an_epoch_in(tmp_path, data):
    # given a device on which the prediction's arm, racing first and uncapped, sits at chance on every seed
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    ran: list = []
    slots = lambda i, n, workdir: RaceSlot(device, 128, ran=ran, stuck=lambda b, lr, seed: b == 32)  # noqa: E731
    settings = FindSettings(name="fbs", optimizer="sgd", race=True, until="val_loss=0.5")
    # when raced
    record = run_race(settings, data, tmp_path, require_prepared(data), 32, recommendation(32), ANCHOR,
                      lambda line: None, slots=slots)
    # then every race trial may stop at chance, and batch 32's trained an epoch and a step, not their 12 epochs
    raced = [c for c in ran if c.until is not None]
    assert raced and all(c.stop_at_chance for c in raced)
    with Store(store_path(tmp_path), read_only=True) as store:
        stored = {t["key"]: t for t in store.trials(sweep_name("fbs"))}
    assert all(stored[c.key()]["steps"] <= 128 // 32 + 1 for c in raced if c.batch_size == 32)
    # and the race answers with another size
    assert record["decision"]["batch_size"] != 32


def test_a_winner_still_at_its_rates_edge_steps_again_as_the_oracle_does(tmp_path, data):
    # given a device whose 16 is far the fastest size and best at 8 times its rule's rate: two
    # steps beyond the set (half, once, twice the rule's); rates cost little away from the best, so
    # that twice the rule's reaches the target within 12 epochs of 128 images
    steps = {**STEPS, 16: 0.001}
    device = RaceDevice(steps, b_noise=8, log_sd=dict.fromkeys(steps, 0.05), best_factor={16: 8.0})
    device.RATE_COST = 0.1
    lines: list = []
    # when raced
    record = race(tmp_path, data, device, lines=lines)
    # then it stepped to 4 and to 8 times the rule's rate, and past it to 16 (which lost), and
    # answers at 8 times, where one step, as before, answered at 4
    rule = device.rule_rate(16)
    assert record["decision"]["batch_size"] == 16 and record["decision"]["lr"] == pytest.approx(8 * rule)
    assert sorted(record["rates"]["16"]) == pytest.approx([r * rule for r in (0.5, 1, 2, 4, 8, 16)])
    assert len([line for line in lines if "at its set's edge" in line]) == 3


def test_a_budget_that_cuts_an_edges_rate_as_it_climbs_answers_with_the_race_without_it(tmp_path, data):
    # given the device above (16 far the fastest, best at 8 times its rule's rate), trials of 100 s
    steps = {**STEPS, 16: 0.001}
    device = RaceDevice(steps, b_noise=8, log_sd=dict.fromkeys(steps, 0.05), best_factor={16: 8.0})
    device.RATE_COST = 0.1
    ran: list = []
    whole = race(tmp_path / "whole", data, device, fixed=100.0, ran=ran)
    rule = device.rule_rate(16)
    before = next(i for i, c in enumerate(ran) if c.batch_size == 16 and c.lr == pytest.approx(4 * rule))
    # when the budget holds every rung and the first edge step's first rung (2 trials), not its second (4)
    cut: list = []
    record = race(tmp_path / "cut", data, device, fixed=100.0, budget=100 * before + 450, ran=cut)
    # then the step ran its first rung's 2 seeds, and the race stops there and answers as the race
    # before the step did, saying what it left out
    assert sum(c.batch_size == 16 and c.lr == pytest.approx(4 * rule) for c in cut) == 2
    assert whole["stopped"] == {"by": "finished"}
    assert record["stopped"]["by"] == "budget" and record["stopped"]["rungs_finished"] == 3
    assert record["stopped"]["extension_skipped"] == str(Arm(16, 4 * rule))
    assert record["decision"]["lr"] == pytest.approx(2 * rule) and record["decision"]["seeds"] == 18
    assert not any(r["batch_size"] == 16 and r["lr"] == pytest.approx(4 * rule) for r in record["decision"]["arms"])


def test_the_predictions_size_races_even_where_the_factor_2_grid_would_thin_it_and_races_first(data):
    # given probes at 16, 24 and 32 (a factor-2 grid keeps 16 and 32) and a prediction of 24
    table = {16: 0.006, 24: 0.008, 32: 0.01}
    rec = {"batch_size": 24, "statistics": "open above", "b_noise": None, "interval": [0.0, None],
           "table": [{"batch_size": b, "step_seconds": t} for b, t in table.items()]}
    settings = FindSettings(optimizer="sgd", race=True, until="val_loss=0.5")
    # when the race is planned
    plan = new_plan(settings, Raced.of(settings, require_prepared(data), None, None), rec, ANCHOR, {})
    # then 24 races, and races first (its trials cap the others')
    assert plan["sizes"] == [16, 24, 32] and plan["first"]["batch_size"] == 24


def test_the_prediction_agrees_where_the_race_cannot_tell_it_from_the_leader():
    decision = {"batch_size": 16, "tied": [{"batch_size": 32, "lr": 0.01}],
                "arms": [{"batch_size": 32, "ratio": 1.1, "seeds": 18}, {"batch_size": 128, "ratio": 1.9, "seeds": 2}]}
    assert against_prediction(decision, 32)["agrees"] is True
    miss = against_prediction(decision, 128)
    assert miss["agrees"] is False and miss["ratio"] == 1.9 and miss["raced"] is True
    assert against_prediction(decision, 4)["raced"] is False


def test_find_batch_size_json_carries_the_race_and_the_advice_answers_with_it(tmp_path, data):
    from catsdogs.advice import BatchSizeAdvice

    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    record = race(tmp_path, data, device, budget=4300, fixed=100.0)
    base = {"largest_fitting": 64, "recommendation": {"batch_size": 32, "learning_rate": 0.01}, "race": record}
    advice = BatchSizeAdvice.from_json(FindResult.from_dict(base).to_json())
    assert advice.batch_size == record["decision"]["batch_size"] and advice.learning_rate == record["decision"]["lr"]
    assert advice.predicted_batch_size == 32 and advice.race_seconds[0] == pytest.approx(record["decision"]["seconds"])
    assert advice.learning_rate_rule == "raced" and advice.batch_size not in advice.race_tied
    with pytest.raises(CatsdogsError, match="race must be an object"):
        FindResult.from_dict({**base, "race": [1]})


@pytest.mark.parametrize(("field", "value", "key"), [
    ("race_budget", 0, "race_budget"), ("race_budget", math.nan, "race_budget"),
    ("race_budget", 10.0 ** 20, "race_budget"), ("race_budget", True, "race_budget"),
    ("race_workers", 0, "race_workers"), ("until", "val_auc=0.9", "until"), ("race_runner", "slurm", "race_runner"),
    ("ray_address", "auto", "ray_address")])
def test_a_race_setting_out_of_bounds_is_one_setting_error_naming_it(field, value, key):
    with pytest.raises(SettingError) as caught:
        FindSettings(race=True, **{field: value}).check()
    assert caught.value.key == key


@pytest.mark.parametrize(("field", "value"), [("race_budget", 60.0), ("race_runner", "ray"), ("ray_address", "auto"),
                                              ("race_workers", 2)])
def test_a_race_setting_without_the_race_is_refused(field, value):
    with pytest.raises(SettingError, match="give --race") as caught:
        FindSettings(**{field: value}).check()
    assert caught.value.key == field
    FindSettings(race_workers=1).check()  # (the default before 0.31.0: still taken without the race)


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_find_batch_size_races_on_this_device_answers_with_the_measured_fastest_and_continues_when_run_again(
        prepared_data, tmp_path):
    # given the article's model on 48 training images, the search up to batch 8, and a target the
    # untrained model reaches at once (every trial ends at its first evaluation: a race in seconds)
    import catsdogs

    data = prepared_data(32, (24, 8, 8))
    lines: list = []
    call = dict(data_dir=data, out=tmp_path, max_batch_size=8, noise_scale=False, optimizer="sgd", race=True,
                until="val_loss=50", log=lines.append)
    # when find_batch_size races
    advice = catsdogs.find_batch_size(**call)
    # then the advice is the race's measured fastest, the prediction beside it, and the JSON holds the race
    race_record = advice.result.race
    assert race_record["decision"] is not None and advice.batch_size == race_record["decision"]["batch_size"]
    assert advice.predicted_batch_size == advice.result.recommendation["batch_size"]
    assert advice.result.hand_off["batch_size"] == advice.batch_size
    assert catsdogs.BatchSizeAdvice.from_json(tmp_path / "find-batch-size" / "find_batch_size.json") == advice
    assert any(line.startswith("  Measured fastest: batch size") for line in lines)
    # and when the same call runs again, the race continues from the store: no trial runs again
    again: list = []
    catsdogs.find_batch_size(**{**call, "log": again.append})
    assert any("continuing the race" in line for line in again)
    assert not any(line.startswith("[") for line in again)  # no trial's progress line
    with Store(store_path(tmp_path), read_only=True) as store:
        assert len(store.trials(sweep_name("find-batch-size"))) == race_record["trials"]
    # and the report reads the race as a sweep: one series to the target, whatever cap each trial ran under
    said: list = []
    catsdogs.report(sweep_name("find-batch-size"), out=tmp_path, log=said.append)
    assert any("time to the target (SGD, standard, to the target, 32 px)" in line for line in said)


# --- a user's model ---------------------------------------------------------------------------------


def users_model(prepared, **fields) -> Raced:
    """A user's model on the prepared data, as model_check.Raced has it (a folder's: `fields`)."""
    fingerprint = require_prepared(prepared)["fingerprint"]["standard"]
    return Raced(**{"model": "my_models:tiny@0123456789abcdef", "task": {"model": "my_models:tiny", "loss": "auto"},
                    "data": fingerprint, "train_images": 128, **fields})


def test_a_users_models_race_keys_every_trial_by_the_model_and_hands_each_trial_the_model(tmp_path, data):
    # given a user's model raced on the prepared data, and the article's raced on them after it
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    mine, users, theirs = [], [], []
    raced = users_model(data)
    record = race(tmp_path, data, device, name="mine", ran=mine, users=users, raced=raced)
    race(tmp_path, data, device, name="theirs", ran=theirs)
    # then every trial of the user's race trained the user's model, and carries it in its identity
    assert mine and all(c.model == raced.model for c in mine)
    assert users == [raced.task] * len(mine)
    with Store(store_path(tmp_path), read_only=True) as store:
        assert {row["config"]["model"] for row in store.trials(sweep_name("mine"))} == {raced.model}
    # and the article's race took none of them for its own: its trials all ran, under other keys
    assert len(theirs) == len({c.key() for c in theirs}) and not {c.key() for c in mine} & {c.key() for c in theirs}
    assert all(c.model is None for c in theirs) and record["decision"] is not None


def test_a_users_folder_races_only_the_sizes_with_a_batch_in_what_its_trials_train_on(tmp_path, data):
    # given a user's folder whose trials train on 40 images (a tenth tests, a tenth of the rest validates)
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    raced = users_model(data, train_images=40, data="f00+validation",
                        task={"model": "my_models:tiny", "loss": "auto", "data_folder": "/pics", "validation": True})
    # when raced over probes up to 64
    record = race(tmp_path, data, device, raced=raced, budget=4300, fixed=100.0)  # (one rung: quick)
    # then 64, with no whole batch in 40 images, is not raced
    assert record["sizes"] and max(record["sizes"]) <= 40 and 32 in record["sizes"]


def test_a_reference_run_leaves_chance_by_the_models_own_classes(tmp_path, data, monkeypatch):
    # given a reference run ending at a loss of 0.8: near chance for two classes (ln 2 = 0.69), well below it for three
    monkeypatch.setattr(RaceSlot, "REFERENCE_LOSSES", (0.95, 0.9, 0.8))
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    # when a three-class model races with no target given
    record = race(tmp_path, data, device, until=None, raced=users_model(data, classes=3), budget=4300, fixed=100.0)
    # then the reference learned (0.9 ln 3 = 0.99): its loss is the target
    assert record["target"] == "val_loss=0.8"
    # and the article's two classes would not have
    with pytest.raises(CatsdogsError, match=r"0.800, not below 0.9 ln 2 = 0.624, off chance"):
        race(tmp_path, data, device, until=None, name="article")


def test_a_stored_race_of_another_model_is_refused_in_one_line(tmp_path, data):
    device = RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD)
    race(tmp_path, data, device, raced=users_model(data), budget=4300, fixed=100.0)
    edited = users_model(data, model="my_models:tiny@fedcba9876543210")  # (the function's model changed)
    with pytest.raises(CatsdogsError, match="other settings \\(model\\).*another --name"):
        race(tmp_path, data, device, raced=edited, budget=4300, fixed=100.0)



def test_a_users_folder_races_with_a_validation_tenth_held_out_and_keyed_by_the_folder_and_the_model():
    from catsdogs.measure.model_check import ProbeData
    from catsdogs.messages import ModelInfo
    from catsdogs.schema import Status

    # given a user's function model of three classes checked on a folder of 120 images
    info = ModelInfo(status=Status.DONE, name="tiny", classes=3, architecture="abc123",
                     source={"model": "my_models:tiny", "kind": "function"})
    spec = [32, 32, 3, 3, "float32"]
    folder = ProbeData(None, spec, "/pics", "120 images", count=120, decoded="/work/decoded.npz", fingerprint="f00",
                       classes=3)
    settings = FindSettings(model="my_models:tiny", race=True)
    # when the race is given its model and data
    raced = Raced.of(settings, None, info, folder)
    # then its trials train the model on the folder with a tenth of the training part validating
    assert raced.task == {"model": "my_models:tiny", "loss": "auto", "input_spec": spec,
                          "data_folder": "/work/decoded.npz", "validation": True, "images": "/pics"}
    assert raced.train_images == 97 and raced.classes == 3  # (120: 12 test, 11 validation)
    # and they are keyed by the function and its layers' digest, and by the folder and the split
    assert (raced.model, raced.data) == ("my_models:tiny@abc123", "f00+validation")
    # and numpy arrays (the Python API's data=(x, y)) race alike, keyed by their digest
    arrays = ProbeData(None, spec, None, "120 arrays", count=120, decoded="/work/arrays.npz", arrays="a0",
                       fingerprint="a0", classes=2)
    raced = Raced.of(settings, None, info, arrays)
    assert (raced.data, raced.train_images, raced.task["images"]) == ("a0+validation", 97, "numpy arrays a0")
    # and chance is the data's: two classes in them, though the model has three outputs
    assert raced.classes == 2
    # and a relative decoded copy is handed over absolute (a Ray actor starts elsewhere)
    relative = ProbeData(None, spec, "pics", "120 images", count=120, decoded="out/x.npz", fingerprint="f00")
    assert Path(relative.task_fields()["data_folder"]).is_absolute()


def test_a_users_race_never_becomes_the_article_models_tuned_rates(tmp_path, data):
    from catsdogs.analysis.anchor import tuned_anchor

    # given a store holding only a race of a user's model on the prepared data (three rates a size, a target)
    race(tmp_path, data, RaceDevice(STEPS, b_noise=8, log_sd=LOG_SD), raced=users_model(data), budget=4300, fixed=100.0)
    # then --from-store finds no tuned rates of the article's model there
    with pytest.raises(SettingError, match="no sweep .* tunes the learning rate"):
        tuned_anchor(tmp_path, "sgd", "standard", 32)


def test_a_race_with_no_size_that_has_a_whole_batch_to_train_is_one_line(data):
    # given probes from 8 (--start 8) and a folder whose race trains on 4 images
    settings = FindSettings(optimizer="sgd", race=True, until="val_loss=0.5")
    rec = {**recommendation(), "table": [{"batch_size": b, "step_seconds": STEPS[b]} for b in (8, 16, 32)]}
    with pytest.raises(CatsdogsError, match="none that fitted has a whole batch in the 4 images.*lower --start"):
        new_plan(settings, users_model(data, train_images=4), rec, ANCHOR, {})


def test_a_saved_model_is_keyed_by_its_name_and_digest_not_its_path_and_random_images_are_not_raced():
    from catsdogs.measure.model_check import ProbeData, identity
    from catsdogs.messages import ModelInfo
    from catsdogs.schema import Status

    # given one model saved twice, as the Python API saves a keras.Model a call (a new file each time)
    saved = [ModelInfo(status=Status.DONE, name="m", classes=2, architecture="abc123",
                       source={"model": f"/work/{i}-model.keras", "kind": "file", "sha256": str(i) * 64}) for i in (1, 2)]
    # then its trials are keyed alike: a second call continues the first's race
    assert identity(saved[0]) == identity(saved[1]) == "m@abc123"
    random_images = ProbeData(None, [20, 24, 1, 2, "float32"], None, "random images")
    with pytest.raises(SettingError, match="races on real images"):
        Raced.of(FindSettings(model="m.keras", race=True), None, saved[0], random_images)
