"""One trial schema: the CLI's options, the store's columns, the report's defaults and a plan's
grid keys all come from catsdogs.schema, and a store written by the old engine still reads."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import fields

import pytest
from click.testing import CliRunner

from catsdogs import plans, report, schema
from catsdogs.cli import cli, sweep
from catsdogs.schema import PROTOCOL_FIELDS, TrialConfig
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


def test_the_report_and_a_plans_grid_use_the_schemas_protocol_and_defaults():
    assert report.PROTOCOL_DEFAULTS == schema.protocol_defaults()
    assert tuple(report.PROTOCOL_DEFAULTS) == PROTOCOL_FIELDS
    assert set(report.ARTICLE_PROTOCOL) <= set(PROTOCOL_FIELDS)
    assert set(PROTOCOL_FIELDS) <= set(plans.GRID_KEYS)


def test_one_vocabulary_of_statuses():
    # the store accepts exactly the schema's statuses
    from catsdogs import findbs, store

    assert store.STATUSES == tuple(schema.STATUSES)
    assert set(schema.FINISHED) <= set(schema.STATUSES) and schema.LOST not in schema.STATUSES
    # a probe that fits is done, as a trial that finished is
    assert findbs.FITS == "done"


def test_a_bad_protocol_value_is_a_one_line_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["sweep", "--out", str(tmp_path), "--budget", "forever"])
    assert result.exit_code == 2
    assert "'forever' is not one of 'epochs', 'steps'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_schema_imports_no_framework():
    code = ("import sys, catsdogs.schema, catsdogs.store, catsdogs.worker, catsdogs.sweep; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
