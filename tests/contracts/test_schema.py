"""One vocabulary and one trial schema: the CLI's options, the store's columns, the report's article
protocol and a plan's grid keys all come from catsdogs.schema; every status is one enum member; a
store written by the old engine still reads."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import fields, replace

import pytest
from click.testing import CliRunner

from catsdogs import plans, schema
from catsdogs.analysis import report
from catsdogs.analysis.rows import ARTICLE_PROTOCOL, is_article_protocol
from catsdogs.cli import cli, sweep
from catsdogs.errors import SettingError
from catsdogs.schema import PROTOCOL_FIELDS, Status, TrialConfig
from catsdogs.seeds import check_adaptive
from catsdogs.store import CSV_COLUMNS, Store


def test_every_protocol_field_is_a_sweep_option_with_the_schemas_default_and_values():
    options = {p.name: p for p in sweep.params}
    for name in PROTOCOL_FIELDS:
        # given a protocol field of the schema, then the sweep command has its option
        option = options[name]
        assert option.opts == ["--" + name.replace("_", "-")]
        # one taking several values (crossed with the grid) defaults to none: the schema's default
        assert option.multiple == schema.multiple(name)
        assert option.default == (() if option.multiple else schema.default(name))
        choices = schema.allowed_values(name)
        assert (tuple(option.type.choices) if choices else None) == choices
        assert option.help == schema.option_help(name)


def test_every_field_is_a_store_column_and_every_protocol_field_a_csv_column(tmp_path):
    with Store(tmp_path / "results.sqlite") as store:
        columns = {r[1]: r[2] for r in store.db.execute("PRAGMA table_info(trials)")}
    for f in fields(TrialConfig):
        assert f.name in columns, f.name
        assert columns[f.name] == schema.sql_columns()[f.name]
    assert set(PROTOCOL_FIELDS) <= set(CSV_COLUMNS)


def test_the_article_protocol_is_every_protocol_option_at_its_default():
    # given the article's protocol as the article states it (docs/protocol.md): Keras's default
    # learning rate, unscaled, no warm-up, n // batch size updates per epoch, no accumulation,
    # float32 on one device
    stated = {"lr": None, "lr_scaling": "none", "warmup_epochs": 0.0, "budget": "epochs", "accumulate": 1,
              "precision": "float32", "strategy": "none", "until": None}  # every trial its epochs
    # then the report's article protocol, derived from the schema, is exactly it
    assert ARTICLE_PROTOCOL == stated
    # and a trial is the article's exactly when no protocol option moves from its default
    assert is_article_protocol({"config": {}})
    assert is_article_protocol({"config": {"base_batch_size": 64}})  # scales nothing under it
    for name, value in (("lr", 0.01), ("lr_scaling", "linear"), ("warmup_epochs", 1.0), ("budget", "steps"),
                        ("accumulate", 2), ("precision", "mixed_bfloat16"), ("strategy", "mirrored")):
        assert not is_article_protocol({"config": {name: value}}), name


def test_every_protocol_field_is_a_key_a_plans_grid_may_vary(tmp_path):
    # given a plan whose grid sets every protocol field to a value of its own
    values = {"lr": 0.002, "lr_scaling": "sqrt", "base_batch_size": 16, "warmup_epochs": 0.5, "budget": "steps",
              "accumulate": 2, "precision": "mixed_float16", "strategy": "mirrored", "until": "val_loss=0.5"}
    assert set(values) == set(PROTOCOL_FIELDS)
    path = tmp_path / "p.toml"
    path.write_text('eval_every = 64\n[grids.g]\nopt = "adam"\nbatch_size = 8\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    # when its trials are made, then each trial carries them
    (trial,) = plans.configs(plans.load(str(path)), 1, image_size=32, fingerprints={"standard": "f"}, backend="jax")
    assert {k: getattr(trial, k) for k in values} == values
    assert trial.eval_every == 64  # a target's evaluations are the trial's too


def test_statuses_are_one_enum_of_strings_with_their_meanings():
    # every status prints, formats and compares as the string the store holds
    for status in Status:
        assert str(status) == f"{status}" == status.value and status == status.value
        assert {status.value: 1}[status] == 1  # one dictionary key
        assert status.meaning
    # the store accepts exactly the statuses a row may have; lost is not one, and says so
    # (nor is interrupted: how a reader shows a running trial whose sweep is gone)
    for shown_only in (Status.LOST, Status.INTERRUPTED):
        assert shown_only not in schema.STORED and "never a stored status" in shown_only.meaning
    assert set(schema.FINISHED) <= set(schema.STORED)
    assert set(schema.UNFINISHED) <= {*schema.STORED, Status.INTERRUPTED}


def test_the_store_refuses_a_status_that_is_not_a_rows(tmp_path):
    with Store(tmp_path / "results.sqlite") as store:
        (key,) = store.register_sweep("s", {}, [{"optimizer": "adam", "batch_size": 8, "dataset": "standard",
                                                 "seed": 0}])
        with pytest.raises(sqlite3.IntegrityError):
            store.db.execute("UPDATE trials SET status=? WHERE key=?", (Status.LOST, key))


@pytest.mark.parametrize("rule, value, key", [
    (schema.check_run_name, "../up", "name"), (schema.check_sha256, "abc", "sha256"),
    (schema.parse_split, "600,200", "split"), (schema.parse_split, "a,b,c", "split"),
])
def test_each_rule_raises_a_setting_error_naming_its_key(rule, value, key):
    with pytest.raises(SettingError) as e:
        rule(value)
    assert e.value.key == key and "\n" not in str(e.value)


@pytest.mark.parametrize("target, most, seeds, key, message", [
    (None, 5, 3, "max_seeds", "give target_ci (--target-ci) too"),
    (0, None, 3, "target_ci", "must be a positive number of points, got 0"),
    (-1.5, None, 3, "target_ci", "got -1.5"),
    (5, 2, 3, "max_seeds", "2 is below the 3 seeds every cell starts with"),
])
def test_adaptive_seeds_are_checked_once_for_plans_and_options(target, most, seeds, key, message):
    with pytest.raises(SettingError, match=re.escape(message)) as e:
        check_adaptive(target, most, seeds)
    assert e.value.key == key
    check_adaptive(5, 8, 3)  # and a good setting passes


def test_a_bad_protocol_value_is_a_one_line_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["sweep", "--out", str(tmp_path), "--budget", "forever"])
    assert result.exit_code == 2
    assert "'forever' is not one of 'epochs', 'steps'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_linear_scaling_is_one_rule_for_trials_and_the_recommendation():
    from catsdogs.recommendation import linear_scaled_lr

    # the recommendation's learning rate is the one a trial with --lr-scaling linear trains with
    for opt, bs in (("adam", 256), ("sgd", 8)):
        trial = TrialConfig(opt, bs, "standard", 0, lr_scaling="linear")
        assert linear_scaled_lr(opt, bs) == schema.learning_rate(trial) == schema.DEFAULT_LR[opt] * bs / 32


# --- a store written by catsdogs 0.2.0, the engine of one process per trial -----------------------

OLD_TRIALS_TABLE = """
CREATE TABLE trials (
  key TEXT PRIMARY KEY, config TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed', 'oom')),
  owner TEXT, attempts INTEGER NOT NULL DEFAULT 0, created_at REAL, started_at REAL, finished_at REAL,
  optimizer TEXT, batch_size INTEGER, dataset TEXT, seed INTEGER, epochs INTEGER, image_size INTEGER,
  lr REAL, lr_scaling TEXT, base_batch_size INTEGER, warmup_epochs REAL, budget TEXT,
  accumulate INTEGER, precision TEXT, strategy TEXT,
  test_accuracy REAL, test_loss REAL, steps INTEGER, batches INTEGER, learning_rate REAL,
  train_seconds REAL, images_per_second REAL, peak_memory_mb REAL, memory_kind TEXT, replicas INTEGER,
  wall_seconds REAL, history TEXT, env TEXT, error TEXT);
CREATE TABLE sweeps (name TEXT PRIMARY KEY, config TEXT, created_at REAL, updated_at REAL);
CREATE TABLE sweep_trials (sweep TEXT NOT NULL, key TEXT NOT NULL REFERENCES trials(key),
  position INTEGER NOT NULL, PRIMARY KEY (sweep, key));
"""


@pytest.fixture
def old_store(tmp_path):
    """Given: a results store as catsdogs 0.2.0 wrote it, three seeds of one cell done."""
    path = tmp_path / "results.sqlite"
    db = sqlite3.connect(path)
    db.executescript(OLD_TRIALS_TABLE)
    db.execute("INSERT INTO sweeps VALUES ('old', '{}', 0, 0)")
    for seed, acc in enumerate((0.6, 0.62, 0.64)):
        cfg = TrialConfig("adam", 32, "standard", seed, epochs=5, image_size=200, data="f" * 16)
        history = [{"epoch": 1, "loss": 0.7, "accuracy": 0.5, "train_seconds": 30.0, "seconds": 31.0}]
        db.execute("INSERT INTO trials (key, config, status, attempts, optimizer, batch_size, dataset, seed, "
                   "epochs, image_size, lr_scaling, base_batch_size, warmup_epochs, budget, accumulate, "
                   "precision, strategy, test_accuracy, steps, history, env) "
                   "VALUES (?, ?, 'done', 1, 'adam', 32, 'standard', ?, 5, 200, 'none', 32, 0.0, 'epochs', 1, "
                   "'float32', 'none', ?, 185, ?, ?)",
                   (cfg.key(), json.dumps(cfg.__dict__), seed, acc, json.dumps(history),
                    json.dumps({"tensorflow": "2.21.0", "keras": "3.15.1"})))
        db.execute("INSERT INTO sweep_trials VALUES ('old', ?, ?)", (cfg.key(), seed))
    db.commit()
    db.close()
    return tmp_path


def test_a_store_from_the_old_engine_still_reads_and_reports(old_store):
    # when today's catsdogs opens it
    with Store(old_store / "results.sqlite") as store:
        trials = store.trials("old")
        columns = {r[1] for r in store.db.execute("PRAGMA table_info(trials)")}
        counts = store.counts([t["key"] for t in trials])
    # then its rows read as they were, the new columns are there and empty
    assert [t["test_accuracy"] for t in trials] == [0.6, 0.62, 0.64]
    assert {"weights_digest", "step_reused", "setup_seconds", "data"} <= columns
    assert all(t["weights_digest"] is None for t in trials)
    assert counts["done"] == 3
    # and the report draws them
    paths = report.report("old", old_store, log=lambda *_: None)
    assert paths["figures"]["optimizers"]["png"].exists()
    assert "62.0" in paths["results_md"].read_text()


def test_a_step_cap_needs_a_target_and_ends_training_in_the_epoch_it_falls_in():
    # given a trial of 10 steps an epoch for 12 epochs
    cfg = TrialConfig("sgd", 10, "standard", 0, epochs=12, until="val_loss=0.5", eval_every=64)
    # then a cap of 25 steps trains into its third epoch, one of 120 or more changes nothing
    assert schema.plan_steps(replace(cfg, max_steps=25), 100) == (10, 3)
    assert schema.plan_steps(replace(cfg, max_steps=500), 100) == (10, 12)
    # and it is part of the trial's identity, not of its compiled step's shape
    assert replace(cfg, max_steps=25).key() != cfg.key() and replace(cfg, max_steps=25).shape() == cfg.shape()
    # and a cap without a target, or not a whole positive number, is refused naming it
    for bad in ({"max_steps": 5, "until": None, "eval_every": None}, {"max_steps": 0}, {"max_steps": 2.5}):
        with pytest.raises(SettingError) as e:
            replace(cfg, **bad).check()
        assert e.value.key == "max_steps"


def test_stopping_at_chance_needs_a_target_and_is_identity_not_shape():
    # given a trial with a target
    cfg = TrialConfig("sgd", 10, "standard", 0, epochs=12, until="val_loss=0.5", eval_every=64)
    stopping = replace(cfg, stop_at_chance=True)
    # then stopping at chance is part of its identity (a trial stopped early is another result), not its step's shape
    stopping.check()
    assert stopping.key() != cfg.key() and stopping.shape() == cfg.shape()
    # and it is refused, naming it, without a target or as anything but true or false
    for bad in ({"until": None, "eval_every": None}, {"stop_at_chance": 1}, {"stop_at_chance": "yes"}):
        with pytest.raises(SettingError) as e:
            replace(stopping, **bad).check()
        assert e.value.key == "stop_at_chance"
