"""catsdogs from Python (catsdogs.api): find_batch_size on a live keras.Model and numpy arrays, the
BatchSizeAdvice it returns, and hostile inputs refused in one line before anything is written."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import catsdogs
from catsdogs.cli import cli
from catsdogs.data import folder as folder_data

STORED = Path(__file__).parents[1] / "fixtures" / "find_batch_size.json"  # an answer of 0.19.0's API, written by the run


def small_model(classes: int = 3, size: int = 16):
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((size, size, 3)), layers.Rescaling(1 / 255), layers.Conv2D(4, 3),
                             layers.ReLU(), layers.GlobalAveragePooling2D(), layers.Dense(classes)], name="small")


def coloured(per_class: int = 40, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Three classes told apart by their colour, with noise; sorted by class, as a folder reads them."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.clip(rng.normal(60 + 70 * k, 40, (per_class, size, size, 3)), 0, 255).astype(np.uint8)
                        for k in range(3)])
    return x, np.repeat(np.arange(3), per_class)


# --- the advice -----------------------------------------------------------------------------------------


def test_the_advice_reads_find_batch_size_json_and_writes_it_back_unchanged():
    # given a find_batch_size.json an API run wrote
    text = STORED.read_text()
    # when it is read as advice and written again
    advice = catsdogs.BatchSizeAdvice.from_json(text)
    again = catsdogs.BatchSizeAdvice.from_json(advice.to_json())
    # then the fields a training script needs are the file's, and the round trip loses nothing
    saved = json.loads(text)
    assert advice.batch_size == saved["recommendation"]["batch_size"]
    assert advice.learning_rate == saved["recommendation"]["learning_rate"]
    assert advice.largest_fitting == saved["largest_fitting"] and advice.fastest == saved["fastest"]["batch_size"]
    assert advice.noise_scale == saved["noise_scale"]["b_simple"]
    assert advice.noise_interval == (saved["noise_scale"]["low"], saved["noise_scale"]["high"])
    assert json.loads(advice.to_json()) == saved and again == advice
    assert catsdogs.BatchSizeAdvice.from_json(STORED) == advice  # a Path reads the file


def test_the_advice_says_itself_in_one_readable_line():
    advice = catsdogs.BatchSizeAdvice.from_json(STORED)
    text = repr(advice)
    assert text.startswith(f"BatchSizeAdvice(batch_size={advice.batch_size}, learning_rate=")
    assert f"largest_fitting={advice.largest_fitting} ({advice.stopped_by})" in text and "\n" not in text


def test_the_advice_plots_the_predicted_time_on_the_axis_it_is_given():
    from matplotlib.figure import Figure

    advice = catsdogs.BatchSizeAdvice.from_json(STORED)
    ax = Figure().subplots()
    assert advice.plot(ax) is ax
    # then the estimate's line and the worst case's, one point a probed size, and the recommendation ringed
    estimate, worst = ax.get_lines()
    assert list(estimate.get_xdata()) == [r["batch_size"] for r in advice.table]
    assert list(worst.get_ydata()) == [r["worst_case"] for r in advice.table]
    assert ax.get_xscale() == "log" and f"recommended: {advice.batch_size}" in ax.get_legend_handles_labels()[1]


@pytest.mark.parametrize("text, said", [
    ("{}", "no 'largest_fitting'"), ("[1]", "a JSON object is due, got list"),
    ("not json", "not find-batch-size's JSON"),
    ('{"interrupted": true, "largest_fitting": null}', "interrupted"),
    ('{"interrupted": true}', "an interrupted find-batch-size run holds no answer"),  # its own words, reached
    ('{"largest_fitting": "big"}', "largest_fitting must be a batch size"),
    ('{"largest_fitting": NaN}', "NaN is no JSON number"), ('{"largest_fitting": 1e400}', "must be a batch size"),
    ('{"largest_fitting": 8, "recommendation": []}', "recommendation must be an object"),
    ('{"largest_fitting": 8, "recommendation": {"batch_size": "8"}}', "recommendation.batch_size must be"),
    ('{"largest_fitting": 8, "noise_scale": {"b_simple": "x"}}', "noise_scale.b_simple must be a number"),
    ('{"largest_fitting": 8, "racing": {}}', "unknown key 'racing'"),
    ('{"largest_fitting": 8, "race": []}', "race must be an object or null"),
    ('{"largest_fitting": 8, "race": {"target": "val_loss=0.5", "decision": {"batch_size": 8}}}',
     "race.decision must be null or an object of batch_size, lr, seconds"),
    ('{"largest_fitting": 8, "race": {"target": "val_loss=0.5", "decision": {"batch_size": 8, "lr": "fast", '
     '"seconds": 1, "seconds_low": 1, "seconds_high": null, "tied": []}}}', "race.decision must be"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_what_is_not_an_answer_is_no_advice(text, said):
    # given a text that is not find-batch-size's answer as it writes one
    # when it is read as advice, then it is one line of CatsdogsError saying why, at once (not at
    # repr, plot or a field's first use)
    with pytest.raises(catsdogs.CatsdogsError, match=said) as refused:
        catsdogs.BatchSizeAdvice.from_json(text)
    assert "\n" not in str(refused.value)


# --- hostile inputs: one line, the keyword named, nothing written ----------------------------------------


def two_outputs():
    import keras

    inputs = keras.Input((16, 16, 3))
    flat = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, [keras.layers.Dense(3)(flat), keras.layers.Dense(1)(flat)])


def hostile_cases():
    x, y = coloured(4)
    return [
        (dict(model=42, data=None), "model: a keras.Model, a function that builds one"),
        (dict(model="nothing.keras"), "model: no such file: nothing.keras"),
        (dict(model=small_model, data=(x, y[:-1])), r"data: images of shape \(n, height, width, channels\) and as many"),
        (dict(model=small_model(), data=(x, y + 1)), r"data: labels must be whole numbers in 0 .. 2 \(the model's "
                                                     r"classes\), got 3"),
        (dict(model=small_model(), data=(x[:, :8], y)), "data: images of 8 x 16 x 3, the model takes 16 x 16 x 3"),
        (dict(model=small_model(), data=(x.astype("float32") * np.nan, y)), "data: 12 images hold a NaN"),
        (dict(model=small_model(), data=(x, np.eye(3)[y])), r"data: labels must be class indices .* y.argmax"),
        (dict(model=small_model(), data=(x, y), memory_limit=float("inf")), "memory_limit: a positive, finite"),
        (dict(model=small_model(), data=(x, y), memory_limit="lots"), "memory_limit: not a memory size"),
        (dict(model=None, data=(x, y)), "data: your own images go with your own model"),
        (dict(model=small_model(), data=(x, y), optimizer="rmsprop"), "optimizer: "),
        (dict(model=small_model(), data=(x, y), max_batch_size=4, start=8), "max_batch_size: --max 4 is below"),
        (dict(model=small_model(), data=(x, y), precision="mixed_float16"), "precision: a keras.Model keeps"),
        (dict(model=small_model(), data=(x, y), name="../elsewhere"), "name: '../elsewhere': use letters"),
        # the keywords' types, as the command line's options have them (issue 64)
        (dict(model=small_model(), data=(x, y), max_batch_size="16"), r"max_batch_size: must be a whole number, got '16'"),
        (dict(model=small_model(), data=(x, y), max_batch_size=2.5), "max_batch_size: must be a whole number, got 2.5"),
        (dict(model=small_model(), data=(x, y), max_batch_size=True), "max_batch_size: must be a whole number, got True"),
        (dict(model=small_model(), data=(x, y), seed=1.5), "seed: must be a whole number, got 1.5"),
        (dict(model=small_model(), data=(x, y), steps="5"), "steps: must be a whole number, got '5'"),
        (dict(model=small_model(), data=(x, y), noise_scale="no"), "noise_scale: True or False, got 'no'"),
        (dict(model=small_model(), data=(x, y), isolate=1), "isolate: True or False, got 1"),
        (dict(model=small_model(), data=(x, y), memory_limit=[1]), "memory_limit: a number of bytes"),
        (dict(model=two_outputs(), data=(x, y)), "model: has 2 outputs; an image classifier has one"),
    ]


@pytest.mark.parametrize("kwargs, said", hostile_cases(), ids=lambda v: str(v)[:40] if isinstance(v, str) else None)
def test_a_hostile_input_raises_the_documented_error_in_one_line_and_writes_nothing(tmp_path, kwargs, said):
    # when find_batch_size is called with it
    with pytest.raises(catsdogs.CatsdogsError, match=said) as caught:
        catsdogs.find_batch_size(**kwargs, out=tmp_path / "out", data_dir=tmp_path / "none", log=None)
    # then the error is one line, and no run folder (nor a half-written answer) was left
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_numpy_numbers_are_taken_where_python_s_are(tmp_path, monkeypatch):
    from catsdogs import api

    # given numpy's integers and floats where find_batch_size takes whole numbers and bytes
    x, y = coloured(4)
    settings, _, _ = api.find_settings(small_model(), (x, y), memory_limit=np.int64(2**30), optimizer="adam",
                                       max_batch_size=np.int32(64), seed=np.int64(3), precision="float32",
                                       noise_scale=np.bool_(True), loss="auto", from_store=None, name="n",
                                       data_dir=tmp_path, search={"steps": np.int16(4)})
    # then they are read as Python's, as the command line's would be
    assert (settings.memory_cap_bytes, settings.max_batch, settings.seed, settings.steps) == (2**30, 64, 3, 4)
    assert type(settings.max_batch) is int and settings.measure_noise is True


def test_the_filesystems_refusal_is_one_line_naming_the_path(tmp_path):
    # given `out` that is a file, not a folder
    (tmp_path / "out").write_text("mine")
    x, y = coloured(4)
    # when find_batch_size would write under it, then one line of CatsdogsError naming the path, and
    # the file is as it was
    with pytest.raises(catsdogs.CatsdogsError, match="Not a directory") as caught:
        catsdogs.find_batch_size(small_model(), (x, y), out=tmp_path / "out", data_dir=tmp_path / "none", log=None)
    assert "\n" not in str(caught.value) and not isinstance(caught.value, OSError)
    assert (tmp_path / "out").read_text() == "mine"


def test_an_unknown_keyword_is_a_type_error_as_python_says_it():
    with pytest.raises(TypeError, match="unexpected keyword arguments: batchsize"):
        catsdogs.find_batch_size(small_model(), batchsize=8)


def test_importing_catsdogs_loads_none_of_the_api_until_it_is_used():
    # (the workers import catsdogs: the API's modules load on first use, `catsdogs.find_batch_size`)
    import importlib
    import sys

    for name in [m for m in sys.modules if m in ("catsdogs", "catsdogs.api")]:
        del sys.modules[name]
    fresh = importlib.import_module("catsdogs")
    assert "catsdogs.api" not in sys.modules
    assert fresh.find_batch_size is importlib.import_module("catsdogs.api").find_batch_size


# --- the same answer as the command line -------------------------------------------------------------------

DECIDED = ("batch_size", "near_best", "learning_rate", "learning_rate_rule", "learning_rate_anchor")


def redecided(mine: dict, theirs: dict) -> dict:
    """`mine`'s step times (its table: each candidate's images/s and spread) decided by
    find-batch-size's rules with everything else `theirs`: statistics, optimizer, anchor."""
    from catsdogs import goodput, recommendation
    from catsdogs.gradient_noise import NoiseEstimate
    from catsdogs.recommendation import short_run_anchor

    table = mine["recommendation"]["table"]
    estimate = NoiseEstimate.from_dict(theirs["noise_scale"])
    decision = goodput.decide({r["batch_size"]: r["batch_size"] / r["images_per_second"] for r in table},
                              goodput.interval(estimate), {r["batch_size"]: r["step_spread"] for r in table})
    optimizer, b = theirs["settings"]["optimizer"], decision["batch_size"]
    base, base_lr, said = recommendation.anchor_at(b, optimizer, short_run_anchor(theirs["noise_scale"]["rate_test"]))
    lr, rule = recommendation.learning_rate(optimizer, b, base_lr, base,
                                            estimate.b_simple if goodput.resolved(estimate) else None)
    return {"batch_size": b, "near_best": decision["near_best"], "learning_rate": lr, "learning_rate_rule": rule,
            "learning_rate_anchor": said}


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_a_live_model_and_arrays_give_the_command_lines_answer_for_its_saved_model_and_folder(tmp_path,
                                                                                           monkeypatch):
    # given a small model saved to .keras, and its images as numpy arrays and as a folder of PNGs
    # (lossless, in the folder's order: class folders, then file names)
    monkeypatch.chdir(tmp_path)
    model, (x, y) = small_model(), coloured()
    model.save(tmp_path / "small.keras")
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        (tmp_path / "pics" / f"c{label}").mkdir(parents=True, exist_ok=True)
        from PIL import Image

        Image.fromarray(image).save(tmp_path / "pics" / f"c{label}" / f"{i:04d}.png")
    common = ["--memory-limit", "1GiB", "--max", "8", "--data-dir", str(tmp_path / "none")]
    # when the command line measures the file on the folder, and the API the live model on the arrays
    result = CliRunner().invoke(cli, ["find-batch-size", "--model", "small.keras", "--data", "pics", "--out", "cli",
                                      *common])
    assert result.exit_code == 0, result.output
    advice = catsdogs.find_batch_size(model, (x, y), memory_limit="1GiB", max_batch_size=8, out="api",
                                      data_dir=tmp_path / "none", log=None)
    told = catsdogs.BatchSizeAdvice.from_json(Path("cli/find-batch-size/find_batch_size.json"))
    # then the memory limit and the noise scale are the same, seed for seed
    assert (advice.largest_fitting, advice.stopped_by) == (told.largest_fitting, told.stopped_by) == (8, "max")
    for key in ("b_simple", "low", "high", "gradient_sq", "trace", "seeds"):
        assert advice.summary["noise_scale"][key] == told.summary["noise_scale"][key], key
    # and so the decision: each run's step times, decided with the other's statistics, margin,
    # optimizer and learning-rate anchor, give that run's own recommendation and rate (the step times
    # themselves are measured twice, and where sizes tie their noise may pick another: issue 46's rule)
    for mine, theirs in ((advice.summary, told.summary), (told.summary, advice.summary)):
        assert redecided(mine, theirs) == {key: mine["recommendation"][key] for key in DECIDED}
    # and the JSON holds the same keys, the arrays named by their digest where the folder is by its path
    assert set(advice.summary) == set(told.summary)
    assert advice.summary["model"]["data_arrays"] == folder_data.digest(folder_data.from_arrays(x, y))
    assert told.summary["model"]["data_folder"] == str(tmp_path / "pics")
    assert advice.summary["model"]["image_count"] == told.summary["model"]["image_count"] == 120
    assert not list(Path("api/find-batch-size/.work").glob("*.keras"))  # the saved model deleted after


# --- how a model travels to the workers -------------------------------------------------------------------


def test_a_function_the_workers_can_import_travels_by_name_any_other_is_built_here_and_saved(tmp_path,
                                                                                            monkeypatch):
    import sys

    from catsdogs import api

    # given a function in a module of the user's project (importable by a worker started there; a
    # module of its own name, gone from sys.modules after, so no other test imports this one),
    # and one defined inside another function (no worker can import it)
    (tmp_path / "travel_models.py").write_text(
        "import keras\n\ndef tiny():\n    return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),"
        " keras.layers.Dense(2)])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "travel_models", raising=False)
    import travel_models

    monkeypatch.setitem(sys.modules, "travel_models", travel_models)  # (undone at the end: removed)

    def local():
        return travel_models.tiny()

    work = tmp_path / "work"
    # then the first travels as "module:function", nothing written; the second is called here, saved
    assert api._model_reference(travel_models.tiny, work, "float32") == ("travel_models:tiny", None)
    assert not work.exists()
    ref, saved = api._model_reference(local, work, "float32")
    assert ref == str(saved) and saved.parent == work and saved.suffix == ".keras"
    import keras

    assert keras.saving.load_model(saved).count_params() == travel_models.tiny().count_params()

    # and a function that fails says so in one line, naming `model`
    def broken():
        raise RuntimeError("no GPU here")

    with pytest.raises(catsdogs.SettingError, match=r"broken\(\) raised RuntimeError: no GPU here"):
        api._model_reference(broken, work, "float32")


# --- the other commands as functions -----------------------------------------------------------------------


def test_sweep_takes_a_grid_by_keywords_or_a_plan_by_name_and_a_dry_run_trains_nothing(prepared_data, tmp_path):
    data = prepared_data(32)
    # when a grid is given by keywords (optimizer as find_batch_size names it), a dry run
    lines: list[str] = []
    counts = catsdogs.sweep(optimizer=["adam", "sgd"], batch_size=[8, 16], epochs=1, seeds=1, dry_run=True,
                            data_dir=data, out=tmp_path, log=lines.append)
    # then it lists the 4 trials the command would, and trains none (no store)
    assert counts == {"trials": 4, "dry_run": True} and not (tmp_path / "results.sqlite").exists()
    assert any("adam" in line for line in lines)
    # and a plan by name, its seeds overridden, is the plan's grid
    assert catsdogs.sweep("quick", seeds=1, dry_run=True, data_dir=data, out=tmp_path, log=None)["trials"] == 8


def test_the_other_functions_refuse_in_one_line_naming_their_keyword(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword arguments: colour"):
        catsdogs.sweep(colour="red", dry_run=True)
    with pytest.raises(catsdogs.SettingError, match=r"^optimizer: .*\[grids.sweep\] opt: "):
        catsdogs.sweep(optimizer=["rmsprop"], batch_size=[8], dry_run=True, out=tmp_path, log=None)
    with pytest.raises(catsdogs.CatsdogsError, match="no results store") as caught:
        catsdogs.report("nothing", out=tmp_path / "empty", log=None)
    assert "\n" not in str(caught.value)
    with pytest.raises(catsdogs.SettingError, match="^data: .*numpy arrays"):
        catsdogs.profile(small_model(), [4], data={"x": 1}, out=tmp_path, log=None)


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_profile_takes_numpy_arrays_as_find_batch_size_does_and_lets_go_of_their_copy(tmp_path):
    # given a live model and its images as numpy arrays
    x, y = coloured()
    # when profiled at two batch sizes
    rows = catsdogs.profile(small_model(), [4, 8], (x, y), memory_limit="1GiB", steps=2, warmup=1, out=tmp_path,
                            log=None)
    # then both are measured on the arrays, named by their digest, and their decoded copy is gone
    assert [r["batch_size"] for r in rows] == [4, 8] and all(r["status"] == "done" for r in rows)
    saved = json.loads((tmp_path / "profile" / "profile.json").read_text())
    assert saved["settings"]["data_arrays"] == folder_data.digest(folder_data.from_arrays(x, y))
    assert not list((tmp_path / "profile" / ".work").glob("arrays-*"))


NOTEBOOK = """
import os, sys
import keras, catsdogs
from keras import layers

def children():
    mine = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        except OSError:
            continue
        if status.get("PPid", "").strip() == mine and status["State"].split()[0] != "Z":
            out.append((pid, status["Name"].strip()))
    return out

model = keras.Sequential([keras.Input((16, 16, 3)), layers.Conv2D(4, 3), layers.GlobalAveragePooling2D(),
                          layers.Dense(2)])
for call in range(2):
    rows = catsdogs.profile(model, [2], memory_limit="2GiB", steps=2, warmup=1, out=sys.argv[1],
                            data_dir=sys.argv[2], log=None, name=f"p{call}")
    assert rows[0]["status"] == "done", rows
    print("after call", call, children(), flush=True)
"""


@pytest.mark.slow
def test_a_notebook_calling_twice_holds_no_catsdogs_process_between_or_after_its_calls(tmp_path):
    import subprocess
    import sys

    # given a Python process that calls catsdogs twice, as a notebook's kernel would (TensorFlow's
    # workers forked from a template, which a call starts)
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "CATSDOGS_WORKER_TEMPLATE": "1"}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(tmp_path / "none")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # then after each call it holds no process of catsdogs's (no template, no worker)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("after call")]
    assert lines == ["after call 0 []", "after call 1 []"], out.stdout


def _tf_dataset(x, y, batch=None, repeat=False):
    tf = pytest.importorskip("tensorflow")
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.batch(batch) if batch else dataset
    return dataset.repeat() if repeat else dataset


class _Batches:
    """A keras.utils.PyDataset of (x, y) in batches of 5 (`endless`: num_batches None)."""

    def __new__(cls, x, y, endless=False):
        import keras

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return math.ceil(len(x) / 5)

            @property
            def num_batches(self):
                return None if endless else len(self)

            def __getitem__(self, i):
                return x[5 * i:5 * i + 5], y[5 * i:5 * i + 5]

        return Batches()


@pytest.mark.parametrize("how", ["slices", "batched", "pydataset"])
def test_data_as_keras_users_hold_it_reads_as_the_same_arrays(how):
    from catsdogs import api

    # given the arrays, and the same as a tf.data.Dataset (one image an element, or batched as
    # image_dataset_from_directory gives them) or a keras.utils.PyDataset
    x, y = coloured(4)
    data = {"slices": lambda: _tf_dataset(x, y), "batched": lambda: _tf_dataset(x, y, batch=5),
            "pydataset": lambda: _Batches(x, y)}[how]()
    # when find_batch_size reads it (before any worker starts), then it is the arrays' decoded copy
    images, labels = api._data(data, small_model())[1]
    assert images.shape == x.shape and (images == x).all() and (labels == y).all()


def test_a_folder_read_by_image_dataset_from_directory_is_taken_as_its_images(tmp_path):
    keras = pytest.importorskip("keras")
    from PIL import Image

    from catsdogs import api

    # given a folder of two classes, as keras.utils.image_dataset_from_directory reads it
    x, y = coloured(4)
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        if label < 2:
            (tmp_path / f"c{label}").mkdir(exist_ok=True)
            Image.fromarray(image).save(tmp_path / f"c{label}" / f"{i}.png")
    dataset = keras.utils.image_dataset_from_directory(tmp_path, image_size=(16, 16), batch_size=3, shuffle=False)
    # then its images (float32, as Keras gives them) and labels are what the workers get
    images, labels = api._data(dataset, small_model(classes=2))[1]
    assert images.shape == (8, 16, 16, 3) and images.dtype == np.float32 and sorted(set(labels)) == [0.0, 1.0]


@pytest.mark.parametrize("how, said", [
    ("endless", "an endless tf.data.Dataset"), ("endless-py", "an endless PyDataset"),
    ("images", "a dataset of \\(images, labels\\): its elements hold no labels"),
])
def test_data_as_keras_users_hold_it_is_refused_in_one_line_where_it_cannot_be_read(tmp_path, how, said):
    x, y = coloured(4)
    data = {"endless": lambda: _tf_dataset(x, y, batch=5, repeat=True),
            "images": lambda: _tf_dataset(x, y, batch=5).map(lambda a, b: a),
            "endless-py": lambda: _Batches(x, y, endless=True)}[how]()
    with pytest.raises(catsdogs.SettingError, match=f"data: {said}"):
        catsdogs.find_batch_size(small_model(), data, out=tmp_path / "out", data_dir=tmp_path / "none", log=None)
    assert not (tmp_path / "out").exists()
