"""The keywords' table (catsdogs.keywords.KEYWORDS): every keyword of find_batch_size, profile,
sweep, report and GradientNoiseScale checked for its type and bounds before anything runs, each
refusal one SettingError naming the keyword, numpy's numbers taken, and the command line's options
of the same meaning typed from the same table. Nothing trains here."""

from __future__ import annotations

from pathlib import Path

import click
import click.testing
import numpy as np
import pytest

import catsdogs
from catsdogs import keywords
from catsdogs.cli import cli

NOWHERE = "/nonexistent-catsdogs-data"  # (a refusal comes before the data is read)


def call(function: str, folder: Path, **kwargs):
    """The API function with the keyword given and everything else harmless, writing under `out`."""
    given = {"out": folder, "log": None, **kwargs}
    if function == "find_batch_size":
        return catsdogs.find_batch_size(**{"data_dir": NOWHERE, **given})
    if function == "profile":
        return catsdogs.profile(None, [8], **{"data_dir": NOWHERE, **given})
    if function == "sweep":
        return catsdogs.sweep(**{"dry_run": True, "data_dir": NOWHERE, **given})
    return catsdogs.report(**{"name": "sweep", **given})


HOSTILE = [
    ("find_batch_size", "margin", "0.9", "margin: must be a number, got '0.9'"),
    ("find_batch_size", "margin", 1.0, "margin: must be below 1, got 1"),
    ("find_batch_size", "seed", np.int64(-1), "seed: must be at least 0, got -1"),
    ("find_batch_size", "worker_env", ["X=1"], "worker_env: a dict of environment variables' names"),
    ("find_batch_size", "from_store", 5, r"from_store: a path \(a str or a Path\), got 5"),
    ("find_batch_size", "out", 5, r"out: a path \(a str or a Path\), got 5"),
    ("find_batch_size", "until", 5, "until: a str, got 5"),
    ("find_batch_size", "log", "print", "log: a function that takes a line"),
    ("find_batch_size", "mode", "bogus", "mode: unknown mode 'bogus'; choose from power, binsearch"),
    ("profile", "steps", 0, "steps: must be at least 1, got 0"),
    ("profile", "warmup", -1, "warmup: must be at least 0, got -1"),
    ("profile", "min_seconds", "2", "min_seconds: must be a number, got '2'"),
    ("profile", "loss", "hinge", "loss: unknown loss 'hinge'"),
    ("profile", "data_dir", 3.5, "data_dir: a path"),
    ("sweep", "workers", "2", "workers: must be a whole number, got '2'"),
    ("sweep", "workers", 0, "workers: must be at least 1, got 0"),
    ("sweep", "overwrite", "yes", "overwrite: True or False, got 'yes'"),
    ("sweep", "dry_run", "no", "dry_run: True or False, got 'no'"),
    ("sweep", "runner", "slurm", "runner: unknown runner 'slurm'; choose from local, ray"),
    ("sweep", "tensorboard", 1, "tensorboard: True or False, got 1"),
    ("sweep", "epochs", "2", r"sweep\(\): epochs: must be a whole number >= 1, got '2'"),
    ("sweep", "workers", 10**20, "workers: must be at most 1,024: one worker a GPU or a share of the cores"),
    ("report", "name", 5, "name: a str, got 5"),
    ("report", "tensorboard", "yes", "tensorboard: True or False, got 'yes'"),
    ("report", "find_results", "a.json", "find_results: a list of paths, got str"),
    ("report", "note", 5, "note: a str, got 5"),
    ("report", "export_store", 5, "export_store: a path"),
    ("sweep", "plan", 5, "plan: a plan's name, a TOML file's path or a catsdogs.plans.Plan, got int"),
    ("profile", "memory_limit", "4XB", "memory_limit: "),
    ("find_batch_size", "memory_limit", "4XB", "memory_limit: "),
]


@pytest.mark.parametrize("function, key, value, said", HOSTILE, ids=[f"{f}-{k}={v!r}" for f, k, v, _ in HOSTILE])
def test_a_hostile_keyword_is_one_setting_error_naming_it_before_anything_is_written(tmp_path, function, key, value,
                                                                                     said):
    # when the function is called with it
    with pytest.raises(catsdogs.SettingError, match=f"^{said}") as refused:
        call(function, tmp_path / "out", **{key: value})
    # then one line naming the keyword, and nothing under out
    assert "\n" not in str(refused.value) and refused.value.key in (key, "opt", "memory_limit")
    assert not (tmp_path / "out").exists()


def test_numpy_numbers_and_flags_are_taken_in_a_sweeps_grid_as_pythons(prepared_data, tmp_path):
    # given numpy's numbers in a sweep's grid and settings (a notebook's np.arange, say)
    data = prepared_data(32)
    counts = catsdogs.sweep(optimizer=["sgd"], batch_size=np.array([8, 16]), epochs=np.int64(1),
                            seeds=np.int32(1), workers=np.int64(1), dry_run=np.bool_(True), data_dir=data,
                            out=tmp_path, log=None)
    # then the sweep plans them as it would Python's
    assert counts == {"trials": 2, "dry_run": True}
    assert keywords.plain({"a": [np.int64(2), (np.float32(0.5), np.bool_(False))]}) == {"a": [2, (0.5, False)]}
    assert type(keywords.plain(np.int16(3))) is int


# the command line's options that mean what a keyword means: (command, option's name, keyword)
SHARED = [("sweep", "seeds", "seeds"), ("sweep", "epochs", "epochs"), ("sweep", "max_epochs", "max_epochs"),
          ("sweep", "eval_every", "eval_every"), ("sweep", "workers", "workers"), ("sweep", "runner", "runner"),
          ("find-batch-size", "start", "start"), ("find-batch-size", "max_batch", "max_batch_size"),
          ("find-batch-size", "margin", "margin"), ("find-batch-size", "steps", "steps"),
          ("find-batch-size", "resolution", "resolution"), ("find-batch-size", "seed", "seed"),
          ("find-batch-size", "mode", "mode"), ("find-batch-size", "opt", "optimizer"),
          ("find-batch-size", "dataset", "dataset"), ("find-batch-size", "precision", "precision"),
          ("find-batch-size", "loss", "loss"), ("find-batch-size", "race_workers", "race_workers"),
          ("profile", "steps", "steps"), ("profile", "warmup", "warmup")]


@pytest.mark.parametrize("command, option, key", SHARED)
def test_an_option_that_means_what_a_keyword_means_takes_the_same_values(command, option, key):
    # given the option's type as click parses it, and the keyword's entry in the table
    (param,) = [p for p in cli.commands[command].params if p.name == option]
    entry = keywords.keyword(key)
    # then they take the same choices, or the option checks its value by the keyword's own entry
    if isinstance(param.type, click.Choice):
        assert tuple(param.type.choices) == tuple(entry.choices)
    else:
        assert (param.type.entry, param.type.key) == (entry, key)
    # and a value the keyword refuses, the option refuses too (exit 2, one line)
    bad = "bogus" if isinstance(param.type, click.Choice) else str(entry.low - 1)
    flag = "--" + {"max_batch": "max", "race_workers": "workers"}.get(option, option).replace("_", "-")
    result = click.testing.CliRunner().invoke(cli, [command, flag, bad])
    assert result.exit_code == 2 and "Invalid value" in result.output and len(result.output.strip().splitlines()) == 1
