"""`catsdogs reproduce`: the whole article, end to end, on the quick plan."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from catsdogs.cli import cli
from catsdogs.plans import load, trials


def test_the_default_plan_is_the_articles_full_protocol():
    # given the plan `catsdogs reproduce` runs when given none
    default = next(p for p in cli.commands["reproduce"].params if p.name == "plan").default
    plan = load(default).settings
    # then it is the article's protocol: both figures, 1,000 images per class at 200 px, 5 epochs
    assert default == "article" and plan["seeds"] == 3 and plan["epochs"] == 5
    assert plan["prepare"] == {"per_class": 1000, "split": "600,200,200", "size": 200, "seed": 0}
    assert plan["grids"]["optimizers"]["batch_size"] == [16, 32, 64, 128]
    assert plan["grids"]["augmentation"]["batch_size"] == [16, 32, 64, 128, 256]


@pytest.mark.parametrize("args, message", [
    (["--config", "/no/such.toml"], "no such file"),
    (["--config", "quik"], "no plan named 'quik'; plans: article, article-64px, beyond"),
    (["--source", "/no/such/archive.zip"], "no such file or folder"),
    (["--seeds", "0"], "--seeds"),
    (["--name", "../up"], "use letters"),
])
def test_bad_reproduce_options_are_one_line_usage_errors(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["reproduce", "--data-dir", str(tmp_path), "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_reproduce_runs_the_quick_plan_end_to_end_and_shares_trials(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    # when the quick plan runs with one seed (CI's .ci/wheel runs all three), two trials at a time
    args = ["reproduce", "--config", "quick", "--seeds", "1", "--data-dir", str(data),
            "--out", str(out), "--workers", "2", "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # then the two grids' shared Adam / standard trials ran once: 8 cells, not 10, each seed
    assert len(trials(load("quick"), data, "tensorflow")) == 8 * 3
    with open(out / "quick" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"done"}
    assert {r["backend"] for r in rows} == {"tensorflow"}  # recorded, and part of each trial's key
    # and both of the article's figures and the tables exist, marked as synthetic
    for figure in ("optimizers", "augmentation"):
        for ext in ("png", "svg"):
            assert (out / "quick" / "figures" / f"{figure}.{ext}").stat().st_size > 1000
    summary = (out / "quick" / "results.md").read_text()
    assert "synthetic data" in summary and "| Adam | 64 | 1 |" in summary
    # and the claims (the quick plan lacks most of the article's cells: "not run", never an error),
    # and every trial's collapse, drawn
    assert "## The article's claims" in summary and "not run: no finished trial of SGD at 16" in summary
    assert "## Collapses" in summary and (out / "quick" / "figures" / "collapse.png").stat().st_size > 1000
    # and the sweep records the plan it ran, as resolved, and where it came from
    recorded = json.loads((out / "quick" / "sweep.json").read_text())
    assert recorded["plan"]["seeds"] == 1 and recorded["plan"]["name"] == "quick"
    assert recorded["plan_origin"] == "plan 'quick'"
    # when it runs again, then nothing is trained again
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "8 of 8 trials already finished" in again.output
    assert "nothing to do" in again.output and "epoch 1/" not in again.output
