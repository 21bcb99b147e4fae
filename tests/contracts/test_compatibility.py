"""What catsdogs 0.6.0 wrote still loads and reports: its results store and its built-in plans.

tests/fixtures/catsdogs-0.6.0/ holds files 0.6.0 itself wrote (a worktree of its commit, 628d74a):
`results.sqlite` from `catsdogs prepare --source synthetic --per-class 40 --split 24,8,8 --size 32`
then `catsdogs sweep --name old --opt adam sgd --batch-size 8 16 --seeds 2 --target-ci 3
--max-seeds 3 --epochs 1`, whose 8 trials all collapsed to 50%, so that 0.6.0's rule called
every cell settled at 2 seeds (issue 23's defect); and `plans/`, its built-in plans. Tests copy
them before use: a store is changed by opening it (new columns)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from catsdogs import plans
from catsdogs.analysis import report as rp
from catsdogs.analysis.rows import load_trials
from catsdogs.store import RESULT_COLUMNS, Store

OLD = Path(__file__).parents[1] / "fixtures" / "catsdogs-0.6.0"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(OLD / "results.sqlite", out / "results.sqlite")
    return out


def test_a_store_written_by_0_6_0_reads_unchanged_and_a_writer_adds_the_newer_columns(old_store, tmp_path):
    # given the columns 0.6.0's store had (a copy: this test writes to it)
    path = tmp_path / "results.sqlite"
    path.write_bytes((old_store / "results.sqlite").read_bytes())
    before = path.read_bytes()
    with sqlite3.connect(path) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(trials)")}
    assert "noise_scale" not in columns
    # when it is read now (as the report reads it)
    trials = load_trials(path, "old")
    # then every trial is there, as it finished, today's newer columns read as empty, and the
    # store is as it was: a reader writes nothing
    assert len(trials) == 8 and {t["status"] for t in trials} == {"done"}
    assert {t["test_accuracy"] for t in trials} == {0.5}
    assert all(t["noise_scale"] is None for t in trials)
    assert path.read_bytes() == before
    # when a sweep opens it, then it gains every column of today's
    with Store(path):
        pass
    with sqlite3.connect(path) as db:
        after = {r[1] for r in db.execute("PRAGMA table_info(trials)")}
    assert set(RESULT_COLUMNS) <= after


def test_every_trial_of_0_6_0_keeps_its_key(old_store):
    from catsdogs.schema import TrialConfig

    # given the trials 0.6.0 stored, each under the key of its configuration then
    trials = load_trials(old_store / "results.sqlite", "old")
    # then today's configuration of each (with the fields added since, at their defaults) has that key
    for t in trials:
        cfg = TrialConfig.from_dict(t["config"])
        assert (cfg.deterministic, cfg.tf32) == (True, None)
        assert cfg.key() == t["key"]


def test_a_0_6_0_adaptive_sweep_reports_with_the_binomial_floor(old_store):
    # when today's report reads 0.6.0's adaptive sweep, whose identical seeds 0.6.0 called settled
    paths = rp.report("old", old_store, log=lambda *a: None)
    text = paths["results_md"].read_text()
    # then it judges the cells as a sweep now would: none settled by agreement alone
    assert "0 of 4 cells meet it" in text
    adaptive = text.split("## Adaptive seeds")[1]
    assert adaptive.count("decided it") == 4 and "more seeds needed" in adaptive
    # and its figures and claims are made; the noise scale, never recorded then, is not claimed
    assert paths["figures"]["optimizers"]["png"].is_file()
    assert "## Noise scale" not in text and "the noise scale was not measured" in text


@pytest.mark.parametrize("name", sorted(p.stem for p in (OLD / "plans").glob("*.toml")))
def test_each_built_in_plan_of_0_6_0_loads_and_counts_its_trials(name):
    plan = plans.load(str(OLD / "plans" / f"{name}.toml"))
    assert plan.name == name and plans.count(plan) > 0
    if name in plans.names() and name != "tuned":  # unchanged since: the same trials
        assert plans.count(plan) == plans.count(plans.load(name))
