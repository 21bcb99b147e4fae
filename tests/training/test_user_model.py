"""A user's model (--model): the reference read without a framework, the model built and checked
in a worker, its loss chosen from its last layer, and profile run on it (issue 35's first part)."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import keras
import pytest
from click.testing import CliRunner
from keras import layers

from catsdogs import model_ref
from catsdogs.cli import cli
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.training import user_model

SIZE = 32

MODELS = textwrap.dedent("""
    import keras
    from keras import layers


    def three_classes():  # the prepared data's shape, three classes, logits
        return keras.Sequential([keras.Input((32, 32, 3)), layers.Conv2D(4, 3, activation="relu"),
                                 layers.GlobalAveragePooling2D(), layers.Dense(3)], name="three")


    def grey():  # another shape than the prepared data's: random images
        return keras.Sequential([keras.Input((20, 24, 1)), layers.Flatten(),
                                 layers.Dense(1, activation="sigmoid")], name="grey")


    def not_a_model():
        return [1, 2]


    def flat():
        return keras.Sequential([keras.Input((10,)), layers.Dense(1)])
""")


@pytest.fixture
def in_a_project(a_project) -> Path:
    """Given: the current directory holds a module of model functions, as a user's project would."""
    return a_project(MODELS)


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    return prepared_data(SIZE, (24, 8, 8))


# --- the reference, without a framework ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["a b", "module", "module:", ":function", "pkg.mod:fn:x", "1pkg:fn", ""])
def test_a_reference_of_neither_form_is_a_setting_error_naming_model(text):
    with pytest.raises(SettingError) as e:
        model_ref.parse(text)
    assert e.value.key == "model"


def test_a_file_reference_must_exist_and_becomes_absolute_with_its_digest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingError, match="no such file: gone.keras"):
        model_ref.parse("gone.keras")
    (tmp_path / "m.keras").write_bytes(b"zip bytes")
    ref = model_ref.parse("m.keras")
    assert ref == str(tmp_path / "m.keras")
    assert model_ref.source(ref) == {"model": ref, "kind": "file", "sha256": hashlib.sha256(b"zip bytes").hexdigest()}
    assert model_ref.parse("pkg.mod:make") == "pkg.mod:make"
    assert model_ref.source("pkg.mod:make") == {"model": "pkg.mod:make", "kind": "function"}


def test_an_unknown_loss_is_a_setting_error_naming_loss():
    with pytest.raises(SettingError) as e:
        model_ref.check_loss("hinge")
    assert e.value.key == "loss" and model_ref.check_loss(None) == "auto"


# --- the model, built and checked (in this process: what a worker runs) -----------------------------------


def head(*end) -> keras.Model:
    return keras.Sequential([keras.Input((8, 8, 3)), layers.Flatten(), *end])


@pytest.mark.parametrize("end, kind, logits, classes", [
    ((layers.Dense(1),), "binary", True, 2),
    ((layers.Dense(1, activation="sigmoid"),), "binary", False, 2),
    ((layers.Dense(5),), "sparse-categorical", True, 5),
    ((layers.Dense(5, activation="softmax"),), "sparse-categorical", False, 5),
    ((layers.Dense(5), layers.Activation("softmax")), "sparse-categorical", False, 5),
    ((layers.Dense(5, activation="softmax"), layers.Dropout(0.1)), "sparse-categorical", False, 5),
    ((layers.Dense(5), layers.Softmax()), "sparse-categorical", False, 5),
    ((keras.Sequential([layers.Dense(5, activation="softmax")]),), "sparse-categorical", False, 5),
])
def test_the_loss_is_read_from_the_last_layers_width_and_activation(end, kind, logits, classes):
    choice = user_model.choose_loss(head(*end))
    assert (choice.kind, choice.from_logits, choice.classes) == (kind, logits, classes)
    loss, metrics = user_model.loss_and_metrics(choice)
    assert loss.get_config()["from_logits"] is logits and metrics[0].name == "accuracy"


@pytest.mark.parametrize("end, said", [
    ((layers.Dense(1, activation="softmax"),), "a softmax over 1 unit, which is always 1"),
    ((layers.Dense(1), layers.Softmax()), "a softmax over 1 unit, which is always 1"),
    ((layers.Dense(2, activation="sigmoid"),), "sigmoids over 2 units, each a probability of its own"),
    ((layers.Dense(3), layers.Lambda(lambda x: keras.ops.softmax(x))), "ends in Lambda"),
])
@pytest.mark.parametrize("loss", ["auto", "binary", "sparse-categorical"])
def test_an_ending_no_loss_reads_with_confidence_is_refused_naming_loss(end, said, loss):
    # given a model whose last layer would have been misread (a softmax of one unit as logits, two
    # sigmoids as a softmax's logits, a softmax inside a Lambda as logits and given a second one)
    with pytest.raises(CatsdogsError) as e:
        user_model.choose_loss(head(*end), loss)
    # then it is refused, naming --loss, whatever the loss asked for
    assert str(e.value).startswith(f"--loss {loss}: ") and said in str(e.value)


def test_keras_own_layers_at_the_end_pass_the_activation_on():
    choice = user_model.choose_loss(head(layers.Dense(4, activation="softmax"), layers.Dropout(0.2), layers.Flatten()))
    assert (choice.kind, choice.from_logits) == ("sparse-categorical", False)
    # an all-convolutional classifier: a 1x1 convolution to the classes, then global pooling: logits
    conv = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(3, 1), layers.GlobalAveragePooling2D()])
    assert user_model.choose_loss(conv).from_logits

    class Mine(layers.Layer):  # a layer of the user's own: what it outputs cannot be told
        def call(self, x):
            return x

    with pytest.raises(CatsdogsError, match="ends in Mine"):
        user_model.choose_loss(head(layers.Dense(3), Mine()))


def test_a_loss_named_against_the_last_layers_width_is_refused():
    with pytest.raises(CatsdogsError, match="--loss binary: needs a last layer of width 1; this model's is 5"):
        user_model.choose_loss(head(layers.Dense(5)), "binary")
    with pytest.raises(CatsdogsError, match="width at least 2"):
        user_model.choose_loss(head(layers.Dense(1)), "sparse-categorical")


def exiting(project: Path) -> None:
    """Given: two modules of the user's that call sys.exit, one at its import, one in its function."""
    (project / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    (project / "exits_in_function.py").write_text("import sys\n\ndef make():\n    sys.exit('bye')\n")


def test_what_is_not_a_model_of_images_is_refused_in_one_line(in_a_project):
    with pytest.raises(CatsdogsError, match="returned list, not a Keras model"):
        user_model.build("my_models:not_a_model")
    with pytest.raises(CatsdogsError, match=r"its input has shape \(10,\)"):
        user_model.build("my_models:flat")
    with pytest.raises(CatsdogsError, match="cannot import no_such_module: ModuleNotFoundError"):
        user_model.build("no_such_module:f")
    with pytest.raises(CatsdogsError, match="my_models has no function nothing"):
        user_model.build("my_models:nothing")
    # a module that exits, at its import or in its function, is named with its own exit
    exiting(in_a_project)
    with pytest.raises(CatsdogsError, match=r"importing exits_at_import exited: sys.exit\(3\)"):
        user_model.build("exits_at_import:make")
    with pytest.raises(CatsdogsError, match=r"make\(\) exited: sys.exit\('bye'\)"):
        user_model.build("exits_in_function:make")
    (in_a_project / "bad.keras").write_text("not a zip")
    with pytest.raises(CatsdogsError, match="not a Keras model Keras can load"):
        user_model.build(str(in_a_project / "bad.keras"))
    a, b = keras.Input((4, 4, 3)), keras.Input((4, 4, 3))
    with pytest.raises(CatsdogsError, match="has 2 inputs and 1 outputs"):
        user_model.check(keras.Model([a, b], layers.Flatten()(layers.Add()([a, b]))), "m:two")
    built = user_model.build("my_models:three_classes")
    info = user_model.describe(built, user_model.choose_loss(built))
    assert info["input_shape"] == [32, 32, 3] and info["classes"] == 3 and info["parameters"] == built.count_params()


def test_a_sequential_without_an_input_is_told_to_begin_with_one():
    with pytest.raises(CatsdogsError, match=r"begin it with keras.Input\(shape\)"):
        user_model.check(keras.Sequential([layers.Dense(1)]), "m:f")


@pytest.mark.parametrize("args, option, words", [
    (["--model", ""], "--model", "is neither a saved model"),
    (["--loss", "binary"], "--loss", "give --model too"),
    (["--model", "SAVED", "--precision", "mixed_float16"], "--precision", "a saved model keeps the precision"),
])
def test_options_that_go_only_with_a_model_of_ones_own_are_refused_before_any_worker(args, option, words, data_dir,
                                                                                     tmp_path):
    (tmp_path / "m.keras").write_bytes(b"zip")
    args = [str(tmp_path / "m.keras") if a == "SAVED" else a for a in args]
    for command in ("profile", "find-batch-size"):
        result = CliRunner().invoke(cli, [command, "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), *args])
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output and words in result.output
        assert not (tmp_path / "out").exists()


def test_the_article_models_find_batch_size_json_records_no_model_keys(tmp_path):
    from catsdogs.measure.settings import FindSettings

    assert not {"model", "loss", "images"} & set(FindSettings().recorded(64, None, tmp_path))
    assert FindSettings(model="m:f").recorded(64, None, tmp_path)["model"] == "m:f"


def test_the_example_models_are_image_classifiers_it_accepts(monkeypatch):
    # given the repository's root on the path, as `--model examples.example_models:...` needs
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    for name, batchnorm, loss in (("resnet_small", True, "binary"), ("mobilenet", True, "binary"),
                                  ("small_cnn", False, "sparse-categorical")):
        model = user_model.build(f"examples.example_models:{name}")
        assert user_model.choose_loss(model).kind == loss and model.inputs[0].shape[1:] == (32, 32, 3)
        layers_all = [sub for layer in model.layers for sub in getattr(layer, "layers", [layer])]
        assert batchnorm == any(isinstance(sub, layers.BatchNormalization) for sub in layers_all)


@pytest.mark.parametrize("size", [32, 200])
def test_the_article_models_flops_counted_by_its_layers_are_its_analytic_count(size):
    from catsdogs.training.costs import train_flops_per_image
    from catsdogs.training.model import build_model

    # given the article's model handed in as a user's, then its FLOPs by its layers are the built-in count
    assert user_model.train_flops_per_image(build_model(size)) == (train_flops_per_image(size), [])


def test_depthwise_and_separable_convolutions_are_counted_and_an_unknown_layer_makes_the_count_unknown():
    # given a depthwise 3x3 (8 channels, 8x8 out) then a separable 3x3 to 4 filters (6x6 out), a Dense(1)
    model = keras.Sequential([keras.Input((10, 10, 8)), layers.DepthwiseConv2D(3), layers.BatchNormalization(),
                              layers.SeparableConv2D(4, 3), layers.Flatten(), layers.Dense(1)])
    forward = 2 * (9 * 8 * 64) + 2 * (9 * 8 + 8 * 4) * 36 + 2 * 144
    # then the count is three forward passes of their multiply-adds (BatchNormalization not counted)
    assert user_model.train_flops_per_image(model) == (3.0 * forward, [])
    # and a layer with weights it does not know makes it unknown, naming the layer's kind
    seq = keras.Sequential([keras.Input((8, 8)), layers.LSTM(4), layers.Dense(1)])
    assert user_model.train_flops_per_image(seq) == (None, ["LSTM"])


def test_a_users_models_memory_is_predicted_on_the_line_through_its_two_probes():
    from catsdogs.training.costs import line_second_batch, predict_max_batch_size_line

    mib = 2**20
    # given a cap of 2048 MiB, batch size 1 peaking at 800 MiB and 1.5 MiB of activations an image
    second = line_second_batch(2048 * mib, 800 * mib, 1.5 * mib)
    # then the second probe is a fifth of what the activations would fit, a multiple of 8
    assert second == 160  # 1248 / 1.5 / 5 = 166, down to a multiple of 8
    # when it peaks at 1000 MiB (1.258 MiB an image), then the line meets the cap at 993
    pred = predict_max_batch_size_line(2048 * mib, 1, 800 * mib, second, 1000 * mib)
    assert pred["max_batch_size"] == 993 and pred["method"] == "line" and second <= pred["max_batch_size"] / 4
    assert pred["baseline_bytes"] + pred["per_image_bytes"] * 993 <= 2048 * mib
    # and a second peak no higher than the first gives no line, and no room a probe of 8
    assert predict_max_batch_size_line(2048 * mib, 1, 800 * mib, 160, 790 * mib) is None
    assert line_second_batch(700 * mib, 800 * mib, 1.5 * mib) == 8


def test_the_article_model_is_told_by_its_layers_saved_or_built_and_another_is_not(tmp_path):
    from catsdogs.training.model import build_model

    # given the article's model built, saved and loaded, and one with another hidden layer's width
    build_model(32).save(tmp_path / "article.keras")
    loaded = keras.saving.load_model(tmp_path / "article.keras", compile=False)
    other = keras.Sequential([keras.Input((32, 32, 3), dtype="uint8"), layers.Rescaling(1.0 / 255),
                              layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform",
                                            padding="same"),
                              layers.MaxPooling2D((2, 2)), layers.Flatten(),
                              layers.Dense(64, activation="relu", kernel_initializer="he_uniform"),
                              layers.Dense(1, dtype="float32")])
    # then the first two are the article's at 32 px, the other is not
    assert user_model.article_size(build_model(32)) == user_model.article_size(loaded) == 32
    assert user_model.article_size(other) is None


def test_a_models_architecture_digest_is_the_same_for_two_builds_and_another_for_a_changed_layer():
    def build(width: int, image_width: int = 16):
        return keras.Sequential([keras.Input((16, image_width, 3)), layers.Conv2D(4, 3), layers.GlobalAveragePooling2D(),
                                 layers.Dense(width)])

    # given a function's model built twice in one process (Keras names the second's layers anew),
    # once with a wider last layer, and once on wider images (the same layers and weights' shapes)
    first, second, wider, wider_images = build(2), build(2), build(3), build(2, image_width=24)
    assert [x.name for x in first.layers] != [x.name for x in second.layers]
    # then the two builds have one digest (a race's trials of it are one model's), the others others
    assert user_model.architecture_digest(first) == user_model.architecture_digest(second)
    assert user_model.architecture_digest(wider) != user_model.architecture_digest(first)
    assert user_model.architecture_digest(wider_images) != user_model.architecture_digest(first)
    # and with the weights (a saved model's, its trials' start), two of other values differ
    assert user_model.architecture_digest(first, weights=True) != user_model.architecture_digest(second, weights=True)
    second.set_weights(first.get_weights())
    assert user_model.architecture_digest(first, weights=True) == user_model.architecture_digest(second, weights=True)


def test_a_models_activations_are_its_layers_outputs_an_image():
    model = keras.Sequential([keras.Input((4, 4, 2)), layers.Conv2D(3, 3, padding="same"), layers.Flatten(),
                              layers.Dense(5)])
    # conv 48 + flatten 48 + dense 5 floats of 4 bytes (a Sequential's input is no layer of it)
    assert user_model.activation_bytes(model) == 4 * (48 + 48 + 5)


def test_a_saved_model_is_loaded_with_its_weights(tmp_path):
    model = head(layers.Dense(1))
    model.save(tmp_path / "saved.keras")
    loaded = user_model.build(str(tmp_path / "saved.keras"))
    assert [w.tolist() for w in loaded.get_weights()] == [w.tolist() for w in model.get_weights()]


# --- profile on it (workers) ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_profile_runs_a_users_model_on_the_prepared_data_or_random_images(in_a_project, data_dir, tmp_path):
    out = tmp_path / "out"
    base = ["profile", "--data-dir", str(data_dir), "--out", str(out), "--batch-size", "2", "4", "--steps", "2",
            "--warmup", "1"]
    # when a model of the prepared data's shape is profiled
    same = CliRunner().invoke(cli, [*base, "--model", "my_models:three_classes", "--name", "same"])
    # then it runs on them, says its loss, and every batch size is done
    assert same.exit_code == 0, same.output
    assert "model three: " in same.output and "sparse categorical cross-entropy over 3 classes from logits" in same.output
    assert f"on the prepared data in {data_dir}" in same.output
    saved = json.loads((out / "same" / "profile.json").read_text())
    assert saved["model"]["model"] == "my_models:three_classes" and saved["model"]["classes"] == 3
    assert [r["status"] for r in saved["rows"]] == ["done", "done"] and saved["data"] is not None
    assert saved["settings"]["peak_seconds"] == 0.1  # the matmul peak's timings, as brief_probes set them
    # when a model of another shape is: random images of its shape, said so
    other = CliRunner().invoke(cli, [*base, "--model", "my_models:grey", "--name", "other"])
    assert other.exit_code == 0, other.output
    assert "random images 20 x 24 x 1 (float32) and labels of 2 classes" in other.output
    assert "binary cross-entropy from probabilities" in other.output
    saved = json.loads((out / "other" / "profile.json").read_text())
    assert [r["status"] for r in saved["rows"]] == ["done", "done"] and saved["data"] is None
    assert saved["settings"]["random_images"] is True and saved["settings"]["input_spec"] == [20, 24, 1, 2, "float32"]


@pytest.mark.slow
@pytest.mark.parametrize("model, words", [
    ("my_models:not_a_model", "my_models:not_a_model: returned list, not a Keras model"),
    ("no_such_module:make", "cannot import no_such_module: ModuleNotFoundError"),
    ("my_models:flat", "its input has shape (10,)"),
    ("exits_at_import:make", "importing exits_at_import exited: sys.exit(3)"),  # not CUDA's cuInit, nor exit 1
])
def test_a_model_that_cannot_be_used_is_a_usage_error_in_one_line(in_a_project, data_dir, tmp_path, model, words):
    exiting(in_a_project)
    result = CliRunner().invoke(cli, ["profile", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                                      "--model", model, "--batch-size", "2"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Invalid value for '--model'" in lines[0] and words in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_find_batch_size_refuses_a_model_that_cannot_be_used_in_one_line_and_ends_the_worker_it_checked_it_in(
        in_a_project, data_dir, tmp_path, launched_workers):
    # when find-batch-size is given a function that returns no model (its check in the worker the
    # noise scale's short runs would train in)
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                                      "--model", "my_models:not_a_model", "--memory-limit", "1GiB"])
    # then it is a usage error of one line, and that worker, the only one, has ended
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "my_models:not_a_model: returned list, not a Keras model" in lines[0]
    assert len(launched_workers) == 1 and not launched_workers[0].alive


def test_a_model_of_neither_form_is_refused_before_any_worker_or_folder(data_dir, tmp_path):
    result = CliRunner().invoke(cli, ["profile", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                                      "--model", "not a model", "--batch-size", "2"])
    assert result.exit_code == 2 and "is neither a saved model (PATH.keras) nor a function" in result.output
    assert not (tmp_path / "out").exists()


# --- find-batch-size on it (workers) -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_find_batch_size_searches_a_users_model_for_memory_and_speed(keras_backend, in_a_project, data_dir, tmp_path):
    # given a model of another shape than the prepared data's, and --max 64 to keep the search short
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(out),
                                      "--model", "my_models:grey", "--memory-limit", "1GiB", "--max", "64"])
    # then it searches on random images of its shape, says the noise scale needs real ones,
    # and recommends a size that passed
    assert result.exit_code == 0, result.output
    assert "Your model grey: " in result.output and "random images 20 x 24 x 1" in result.output
    assert "Noise scale: not measured: it needs real images" in result.output
    assert "Critical batch size: not measured: random images have no gradient signal" in result.output
    saved = json.loads((out / "find-batch-size" / "find_batch_size.json").read_text())
    # predicted on either backend by the line through batch size 1 and a fresh probe, that probe within
    # --max: so small a model's memory may not rise above the runs' noise by 64 images, which it says
    second = [p for p in saved["probes"] if p["phase"] == "predict"]
    assert [p["batch_size"] for p in second] == [64] and second[0]["worker"] == "fresh"
    assert ("A line through two probes predicts" in result.output) != ("No prediction before the search: the second "
                                                                       "memory probe (batch size 64)" in result.output)
    assert saved["model"]["model"] == "my_models:grey" and saved["model"]["input_spec"] == [20, 24, 1, 2, "float32"]
    assert saved["settings"]["model"] == "my_models:grey" and saved["largest_fitting"] == 64
    passed = {p["batch_size"] for p in saved["probes"] if p["status"] == "done"}
    assert saved["recommendation"]["batch_size"] in passed


def test_the_stores_tuned_rates_are_refused_for_a_users_model():
    from catsdogs.measure.settings import FindSettings

    with pytest.raises(SettingError) as e:
        FindSettings(model="my_models:grey", anchor={"rates": {"32": 0.001}}).check()
    assert e.value.key == "from_store"


def test_a_small_models_flops_are_shown_not_rounded_to_nothing():
    from catsdogs.measure.model_check import describe
    from catsdogs.messages import ModelInfo

    def line(flops: float) -> str:
        return describe(ModelInfo(status="done", name="m", input_shape=[8, 8, 1], parameters=251, layers=3,
                                  loss_description="binary", train_flops_per_image=flops))

    # given a 251-parameter model's 45,600 FLOPs an image, and the article's 160 million
    assert "0.0456 MFLOPs an image" in line(45_600) and "160.0 MFLOPs an image" in line(160e6)
    assert "1,234.6 MFLOPs" in line(1_234.56e6)


def test_a_user_models_second_memory_probe_never_passes_the_searchs_bound():
    from types import SimpleNamespace

    from catsdogs.measure.memory_prediction import predict_line
    from catsdogs.messages import ProbeRecord

    # given a small model under a 2 GiB cap (a fifth of its room is thousands of images) and a search
    # bounded by a 537-image folder's 429 training images (no --max)
    asked = []

    def probe(batch, phase, aside=False):
        asked.append(batch)
        return ProbeRecord(batch_size=batch, status="done", peak_memory_mb=800.0 + batch * 0.1)

    run = SimpleNamespace(probe=probe)
    calib = ProbeRecord(batch_size=1, status="done", peak_memory_mb=800.0)
    user = SimpleNamespace(activation_bytes_per_image=0.05 * 2**20)
    lines: list[str] = []
    pred = predict_line(run, calib, 2048.0, user, lines.append, bound=429)
    # then the second probe is the bound's size, not one the search can never reach; the line still predicts
    assert asked == [429] and pred is not None and pred["max_batch_size"] > 429
    # and without a bound (random images, no --max) it is a fifth of the room, as before
    asked.clear()
    predict_line(run, calib, 2048.0, user, lines.append)
    assert asked[0] > 4000
