"""A user's model raced (find-batch-size --race --model): its trials train the model on the user's
own images, a tenth of the training part held out to validate (the target is on it), keyed by the
model, and the same call again continues the race; random images are refused before any probe.
The race's decisions on simulated trials: tests/measure/test_race_run.py."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import catsdogs
from catsdogs.cli import cli
from catsdogs.measure.race_run import sweep_name
from catsdogs.store import Store, store_path

MODELS = textwrap.dedent("""
    import keras
    from keras import layers


    def small():  # three classes of 16 px images, logits
        return keras.Sequential([keras.Input((16, 16, 3)), layers.Rescaling(1 / 255),
                                 layers.Conv2D(4, 3, activation="relu"), layers.GlobalAveragePooling2D(),
                                 layers.Dense(3)], name="small")


    def grey():  # another shape than the prepared data's: random images
        return keras.Sequential([keras.Input((20, 24, 1)), layers.Flatten(),
                                 layers.Dense(1, activation="sigmoid")], name="grey")
""")


@pytest.fixture
def pictures(tmp_path):
    """Given: three classes of 40 16 px images each, told apart by their colour."""
    rng = np.random.default_rng(0)
    root = tmp_path / "pics"
    for label, name in enumerate(("ant", "bee", "cow")):
        (root / name).mkdir(parents=True)
        for i in range(40):
            pixels = np.clip(rng.normal(60 + 70 * label, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_find_batch_size_races_a_users_model_on_its_folder_and_continues_the_race_when_called_again(
        a_project, pictures, tmp_path):
    # given a user's model and folder, the search up to batch 8, and a target the untrained model
    # reaches at its first evaluation (a race in seconds)
    a_project(MODELS)
    lines: list = []
    call = dict(data_dir=tmp_path / "none", out=tmp_path / "out", max_batch_size=8, noise_scale=False,
                optimizer="sgd", memory_limit="1GiB", race=True, until="val_loss=50", log=lines.append)
    # when find_batch_size races it
    advice = catsdogs.find_batch_size("my_models:small", pictures, **call)
    # then the advice is the race's measured fastest
    race = advice.result.race
    assert race["decision"] is not None and advice.batch_size == race["decision"]["batch_size"]
    # and every trial trained the user's model, keyed by it, and reached the target on a validation
    # split the folder does not have: a tenth of its 108 training images (120, less a tenth to test)
    identity = f"my_models:small@{advice.result.model['architecture']}"
    with Store(store_path(tmp_path / "out"), read_only=True) as store:
        rows = store.trials(sweep_name("find-batch-size"))
        config = store.sweep_config(sweep_name("find-batch-size"))
    plan = config["race"]
    assert config["data"]["folder"] == str(pictures)  # (the sweep says what it trained on: the user's folder)
    assert rows and {r["config"]["model"] for r in rows} == {identity}
    assert all(r["status"] == "done" and r["target_reached"] == 1 for r in rows)
    assert plan["n_train"] == 97 and plan["identity"]["data"].endswith("+validation")
    # and when the same call runs again (the model checked anew in a new worker), the race
    # continues from the store: no trial runs again
    again: list = []
    catsdogs.find_batch_size("my_models:small", pictures, **{**call, "log": again.append})
    assert any("continuing the race" in line for line in again)
    assert not any(line.startswith("[") for line in again)  # no trial's progress line


@pytest.mark.slow
def test_a_race_of_a_users_model_on_random_images_is_refused_in_one_line_before_any_probe(a_project, prepared_data,
                                                                                          tmp_path):
    # given a model whose input is not the prepared data's, and no folder: random images
    a_project(MODELS)
    out = tmp_path / "out"
    # when find-batch-size is asked to race it
    result = CliRunner().invoke(cli, ["find-batch-size", "--model", "my_models:grey", "--race",
                                      "--data-dir", str(prepared_data(32, (24, 8, 8))), "--out", str(out)])
    # then it is a usage error of one line that says what to give, and no probe ran
    assert result.exit_code == 2, result.output
    assert "'--race': races on real images" in result.output and "give --data DIR" in result.output
    assert "Traceback" not in result.output and not (out / "find-batch-size" / "find_batch_size.json").exists()
    assert "Probe" not in result.output
