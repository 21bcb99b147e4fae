"""Plans: the built-in ones shipped in the package, lookup by name or path, the one TOML format and
its one-line errors, `catsdogs plans`, and `catsdogs --version`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs import __version__, plans
from catsdogs.cli import cli
from catsdogs.plans import PlanError

PACKAGE_PLANS = Path(plans.__file__).parent
GRID = '[grids.g]\nopt = ["adam"]\nbatch_size = [8]\n'


def one_line_usage_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], result.output


# --- built-in plans ----------------------------------------------------------------------------


def test_every_built_in_plan_loads_and_says_what_it_is_and_how_long_it_takes():
    # given the plans shipped in the package
    names = plans.names()
    # then they are the package's TOML files, and the README's plans are among them
    assert names == sorted(p.stem for p in PACKAGE_PLANS.glob("*.toml"))
    assert {"article", "quick", "beyond", "tuned", "article-64px", "figure1"} <= set(names)
    for name in names:
        plan = plans.load(name)
        # each is valid, named after itself, and has a one-line description and duration
        assert plan.name == name and plan.origin == f"plan {name!r}" and plan.ref == name
        for key in ("description", "duration"):
            assert plan.settings[key].strip() and "\n" not in plan.settings[key]
        assert plans.count(plan) > 0


def test_a_plan_is_found_by_name_or_by_path_and_a_file_is_named_after_itself(tmp_path):
    # given a plan file without a name of its own
    path = tmp_path / "mine.toml"
    path.write_text("seeds = 2\n" + GRID)
    # when it is loaded by its path, and a built-in plan by its name
    mine, quick = plans.load(str(path)), plans.load("quick")
    # then the file's plan is named after the file, and the built-in one is the package's
    assert mine.name == "mine" and mine.origin == str(path) and mine.settings["seeds"] == 2
    assert quick.text == (PACKAGE_PLANS / "quick.toml").read_text()
    # and a value with a slash is a path even without .toml
    other = tmp_path / "other"
    other.write_text(GRID)
    assert plans.load(str(other)).name == "other"


def test_a_bad_plan_name_is_a_usage_error_that_lists_the_known_plans(tmp_path):
    result = CliRunner().invoke(cli, ["reproduce", "--config", "quik", "--out", str(tmp_path)])
    one_line_usage_error(result, "Invalid value for '--config': no plan named 'quik'; plans: "
                                 + ", ".join(plans.names()))


def test_a_file_named_like_a_plan_gets_told_to_give_its_path(tmp_path, monkeypatch):
    # given a plan file in the current folder, given without a slash or .toml
    monkeypatch.chdir(tmp_path)
    Path("mine").write_text(GRID)
    with pytest.raises(PlanError, match=r"no plan named 'mine'.*give its path: \./mine"):
        plans.load("mine")


# --- the format: unknown keys and bad values ---------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("optimiser = 'adam'\n" + GRID, "unknown key 'optimiser'; known: name, description"),
    ("[prepare]\nsizes = 64\n" + GRID, "[prepare] unknown key 'sizes'"),
    ('[grids.g]\nopt = ["adam"]\nbatch_size = [8]\nlearning_rate = 0.1\n', "[grids.g] unknown key 'learning_rate'"),
    ('[sweep]\nopt = ["adam"]\n', "unknown key 'sweep'"),  # the old flat format's section: not ignored
    ('name = "q"\n', "no [grids.NAME] section: nothing to train"),
    ('[grids.g]\nopt = ["adam"]\n', "[grids.g] batch_size: is missing"),
    ("seeds = 0\n" + GRID, "seeds: must be a whole number >= 1, got 0"),
    ("seeds = true\n" + GRID, "seeds: must be a whole number >= 1, got True"),
    ("max_seeds = 5\n" + GRID, "max_seeds: caps adaptive seeds, which need a target: give target_ci"),
    ("target_ci = 5\nmax_seeds = 2\n" + GRID, "max_seeds: 2 is below the 3 seeds every cell starts with"),
    ('name = "../up"\n' + GRID, "name: '../up': use letters"),
    ("[prepare]\nsplit = '600,200'\n" + GRID, "[prepare] split: expected three counts"),
    ("[prepare]\nsize = '64'\n" + GRID, "[prepare] size: must be a whole number >= 1, got '64'"),
    ("[prepare]\nsha256 = 'abc'\n" + GRID, "[prepare] sha256: must be 64 hexadecimal digits"),
    ('[grids.g]\nopt = ["adagrad"]\nbatch_size = [8]\n', "[grids.g] opt: unknown optimizer 'adagrad'"),
    ('[grids.g]\nopt = "adam"\nbatch_size = [8, 0]\n', "[grids.g] batch_size: batch sizes must be whole numbers >= 1, got 0"),
    ('[grids.g]\nopt = "adam"\nbatch_size = 8\nlr = [0.001, -1]\n', "[grids.g] lr: learning rate must be positive"),
    ('[grids.g]\nopt = "adam"\nbatch_size = 8\nlr = "fast"\n', "[grids.g] lr: must be a number, got 'fast'"),
    ('[grids.g]\nopt = "adam"\nbatch_size = 8\nlr_scaling = "cubic"\n', "[grids.g] lr_scaling: unknown lr_scaling 'cubic'"),
    ('[grids.g]\nopt = "adam"\nbatch_size = 8\nepochs = [1, 2]\n', "[grids.g] epochs: takes one value"),
    ("seeds = \n", "is not valid TOML"),
])
def test_an_unknown_key_or_a_bad_value_is_a_one_line_usage_error_naming_it(tmp_path, text, message):
    # given a plan file with one thing wrong
    path = tmp_path / "p.toml"
    path.write_text(text)
    # when reproduce and sweep are given it
    for command in ("reproduce", "sweep"):
        result = CliRunner().invoke(cli, [command, "--config", str(path), "--data-dir", str(tmp_path),
                                          "--out", str(tmp_path)])
        # then each refuses it on one line, naming the file and what is wrong, before doing anything
        one_line_usage_error(result, f"{path}: " if "TOML" not in message else str(path))
        assert message in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


def test_command_line_values_replace_a_key_in_every_grid():
    # given the quick plan, whose two grids have different optimizers
    quick = plans.load("quick")
    # when the command line gives one optimizer, fewer seeds and another name
    plan = plans.with_overrides(quick, {"seeds": 1, "name": "q1"}, {"opt": ["sgd"], "epochs": 1})
    # then every grid uses it, the rest of each grid is the plan's
    assert {g["opt"][0] for g in plan.settings["grids"].values()} == {"sgd"}
    assert plan.settings["grids"]["augmentation"]["dataset"] == ["standard", "augmented"]
    assert plan.name == "q1" and plan.settings["seeds"] == 1 and plan.settings["epochs"] == 1
    assert plans.count(plan) == 6  # sgd x {8, 32, 64} x {standard, augmented} (the first grid within), 1 seed
    # and the loaded plan is untouched
    assert quick.settings["grids"]["optimizers"]["opt"] == ["sgd", "adam"] and quick.name == "quick"


def test_a_plan_says_how_to_prepare_its_data_when_sweep_finds_none(tmp_path):
    result = CliRunner().invoke(cli, ["sweep", "--config", "quick", "--data-dir", str(tmp_path / "d"),
                                      "--out", str(tmp_path)])
    # a missing data folder is not a bad option: exit 1 (docs/usage.md, "Exit codes"), in one line
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "catsdogs prepare --data-dir" in lines[0]
    assert "--source synthetic --per-class 120 --split 72,24,24 --size 40" in result.output
    assert "catsdogs reproduce --config quick" in result.output


# --- catsdogs plans ----------------------------------------------------------------------------


def test_plans_lists_every_plan_with_its_description_trials_and_duration():
    result = CliRunner().invoke(cli, ["plans"])
    assert result.exit_code == 0, result.output
    for name in plans.names():
        plan = plans.load(name)
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith(name + " ")]
        assert plan.settings["description"] in line
        assert plan.settings["duration"] in result.output
    assert "24 trials; about a minute" in result.output  # quick: 2 grids sharing 2 cells, 3 seeds
    assert "42-112 trials" in result.output  # article-64px: adaptive, from 3 to at most 8 seeds


def test_plans_with_a_name_prints_the_plan_to_copy(tmp_path):
    # when a plan is printed and saved as a file of one's own
    result = CliRunner().invoke(cli, ["plans", "tuned"])
    assert result.exit_code == 0
    path = tmp_path / "my.toml"
    path.write_text(result.output)
    # then that file is the same plan, under its own name
    assert plans.load(str(path)).settings == {**plans.load("tuned").settings, "name": "tuned"}
    one_line_usage_error(CliRunner().invoke(cli, ["plans", "nope"]), "no plan named 'nope'")


# --- catsdogs --version ------------------------------------------------------------------------


@pytest.mark.parametrize("env, keras_json, says", [
    ({"KERAS_BACKEND": "jax"}, None, "on jax"),
    ({}, {"backend": "jax"}, "on jax"),
    ({}, None, "on tensorflow"),
    ({"KERAS_BACKEND": "torch"}, None, "torch, which catsdogs does not run on"),
])
def test_version_prints_catsdogs_version_and_the_keras_backend(tmp_path, monkeypatch, env, keras_json, says):
    # given Keras's backend chosen by KERAS_BACKEND, by keras.json, or by neither
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if keras_json is not None:
        (tmp_path / "keras.json").write_text(json.dumps(keras_json))
    # when asked for the version
    result = CliRunner().invoke(cli, ["--version"])
    # then one line names catsdogs's version, Keras's, and the backend with what chose it
    assert result.exit_code == 0
    (line,) = result.output.splitlines()
    assert line.startswith(f"catsdogs {__version__}: Keras ") and says in line
    chosen = "KERAS_BACKEND" if env else "keras.json" if keras_json else "Keras's default"
    assert chosen in line
