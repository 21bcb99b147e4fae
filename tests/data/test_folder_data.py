"""A user's images by folder (--data DIR): the layout read, each image decoded and resized to a
model's input once, and every folder the probes cannot use refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from catsdogs.cli import cli
from catsdogs.data import folder
from catsdogs.errors import SettingError


def image(path: Path, height: int, width: int, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), value, dtype=np.uint8)).save(path)


@pytest.fixture
def three_classes(tmp_path) -> Path:
    """Given: three class folders of images of several sizes and formats, and one file that does not decode."""
    root = tmp_path / "pics"
    for label, name in enumerate(("ant", "bee", "cow")):
        for i in range(3):
            image(root / name / f"{i}.{'png' if i % 2 else 'jpg'}", 20 + 5 * i, 30, value=80 * label)
    (root / "bee" / "broken.jpg").write_bytes(b"not an image")
    (root / "cow" / "notes.txt").write_text("not an image file either")
    return root


def test_the_layout_is_its_sorted_class_folders_and_their_image_files(three_classes):
    found = folder.scan(three_classes)
    assert found.classes == ("ant", "bee", "cow") and found.count == 10
    assert found.files["bee"] == ("bee/0.jpg", "bee/1.png", "bee/2.jpg", "bee/broken.jpg")


def test_images_are_decoded_resized_and_labelled_by_class_and_what_does_not_decode_is_counted(three_classes):
    loaded = folder.load(folder.scan(three_classes), 16, 12, 3)
    assert loaded.split.images.shape == (9, 16, 12, 3) and loaded.split.images.dtype == np.uint8
    assert loaded.split.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert loaded.undecodable == ["bee/broken.jpg"]
    # each class's pixels survive the resize (a flat colour stays itself)
    assert int(loaded.split.images[8].max()) in (159, 160, 161)
    grey = folder.load(folder.scan(three_classes), 8, 8, 1, dtype="float32")
    assert grey.split.images.shape == (9, 8, 8, 1) and grey.split.images.dtype == np.float32


def test_a_16_bit_grey_png_is_read_as_keras_reads_it_not_washed_out(tmp_path):
    # given 16-bit grey PNGs: mid-grey (32,768), black, and white (65,535), beside an 8-bit image
    for name, value in (("mid", 32768), ("black", 0), ("white", 65535)):
        (tmp_path / "deep").mkdir(exist_ok=True)
        Image.fromarray(np.full((6, 6), value, np.uint16)).save(tmp_path / "deep" / f"{name}.png")
    assert Image.open(tmp_path / "deep" / "mid.png").mode.startswith("I")  # 16 bits, as Pillow opens it
    image(tmp_path / "flat" / "a.png", 6, 6)
    # when read in colour and in grey
    colour = folder.load(folder.scan(tmp_path), 6, 6, 3)
    grey = folder.load(folder.scan(tmp_path), 6, 6, 1)
    # then each is its top byte, as Keras's decode_png gives 8 bits (mid-grey 128, not clipped to 255)
    names = colour.split.files
    for loaded in (colour, grey):
        values = {n: int(loaded.split.images[names.index(f"deep/{n}.png")].max()) for n in ("mid", "black", "white")}
        assert values == {"mid": 128, "black": 0, "white": 255}


@pytest.mark.parametrize("make, words", [
    (lambda r: r / "missing", "is not a folder"),
    (lambda r: (image(r / "only" / "a.png", 8, 8), r)[1], "holds 1 class folder; a classifier needs at least 2"),
    (lambda r: (image(r / "a" / "a.png", 8, 8), (r / "b").mkdir(), r)[2], "class folder 'b'"),
])
def test_a_folder_without_two_classes_of_image_files_is_refused_naming_data(tmp_path, make, words):
    with pytest.raises(SettingError, match=words) as e:
        folder.scan(make(tmp_path))
    assert e.value.key == "data"


def test_a_class_none_of_whose_files_decodes_is_refused(tmp_path):
    image(tmp_path / "a" / "a.png", 8, 8)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.jpg").write_bytes(b"junk")
    with pytest.raises(SettingError, match="no image of class folder 'b'"):
        folder.load(folder.scan(tmp_path), 8, 8, 3)


def test_the_fingerprint_changes_when_a_file_does(three_classes):
    before = folder.fingerprint(folder.scan(three_classes))
    assert folder.fingerprint(folder.scan(three_classes)) == before
    target = three_classes / "ant" / "0.jpg"
    os.utime(target, ns=(1, 1))
    assert folder.fingerprint(folder.scan(three_classes)) != before


def test_a_folder_without_a_model_of_ones_own_is_a_usage_error(three_classes, tmp_path):
    result = CliRunner().invoke(cli, ["profile", "--data", str(three_classes), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Invalid value for '--data'" in result.output and "give --model too" in result.output


MODEL = """
import keras
from keras import layers


def three():
    return keras.Sequential([keras.Input((16, 12, 3)), layers.Flatten(), layers.Dense(3, activation="softmax")])


def two():
    return keras.Sequential([keras.Input((16, 12, 3)), layers.Flatten(), layers.Dense(2)])
"""


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_profile_and_find_batch_size_run_a_users_model_on_its_folder(three_classes, tmp_path, monkeypatch):
    (tmp_path / "folder_models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    # when a three-class model is profiled on the three-class folder
    result = CliRunner().invoke(cli, ["profile", "--model", "folder_models:three", "--data", str(three_classes),
                                      "--out", str(out), "--batch-size", "4", "16", "--steps", "2", "--warmup", "1"])
    # then it runs on the folder's 9 images that decode, and says so
    assert result.exit_code == 0, result.output
    assert "on 9 images of 3 classes (ant, bee, cow)" in result.output and "1 file that did not decode" in result.output
    saved = json.loads((out / "profile" / "profile.json").read_text())
    assert saved["settings"]["data_folder"] == str(three_classes.resolve()) and saved["settings"]["image_count"] == 9
    assert "(bee/broken.jpg: every name in the JSON)" in result.output
    assert saved["settings"]["undecodable_files"] == ["bee/broken.jpg"]  # named, not only counted
    assert [r["status"] for r in saved["rows"]] == ["done", "done"]
    # and find-batch-size searches on it too
    found = CliRunner().invoke(cli, ["find-batch-size", "--model", "folder_models:three", "--data", str(three_classes),
                                     "--out", str(out), "--max", "4", "--memory-limit", "1GiB", "--no-noise-scale"])
    assert found.exit_code == 0, found.output
    summary = json.loads((out / "find-batch-size" / "find_batch_size.json").read_text())
    assert summary["model"]["data_folder"] == str(three_classes.resolve()) and summary["largest_fitting"] == 4


def test_a_model_of_fewer_classes_than_the_folder_is_refused_in_one_line(three_classes, tmp_path, monkeypatch):
    from catsdogs.measure import model_check
    from catsdogs.messages import ModelInfo

    # given a two-class model, as its check in a worker finds it, and the three-class folder
    two = ModelInfo(status="done", input_shape=[16, 12, 3], classes=2, input_dtype="float32")
    monkeypatch.setattr(model_check, "check_user_model", lambda model, *args, **kwargs: (model, two))
    for command in (["profile", "--batch-size", "4"], ["find-batch-size", "--max", "4", "--memory-limit", "1GiB"]):
        # when profile and find-batch-size are asked to run it on the folder
        refused = CliRunner().invoke(cli, [*command, "--model", "folder_models:two", "--data", str(three_classes),
                                           "--out", str(tmp_path / "out")])
        # then each refuses it, a usage error naming --data, before any probe
        assert refused.exit_code == 2, refused.output
        assert "Invalid value for '--data'" in refused.output and "holds 3 classes, more than the model's 2" in refused.output
        assert "Traceback" not in refused.output and not (tmp_path / "out").exists()


def test_the_folder_is_decoded_once_by_the_parent_and_the_workers_read_that_copy(three_classes, tmp_path):
    from catsdogs.measure import model_check
    from catsdogs.messages import ModelInfo
    from catsdogs.training import steps

    # given a user's model of 16 x 12 colour input and float dtype, and its --data folder
    info = ModelInfo(status="done", input_shape=[16, 12, 3], classes=3, input_dtype="float32")
    # when the parent checks the folder with a work folder to write in
    data = model_check.data_for(info, tmp_path, three_classes, tmp_path / "work")
    # then the probes and short runs are told to read the decoded copy, the records still name the folder
    assert data.task_fields()["data_folder"] == data.decoded and data.decoded.endswith(".decoded.npz")
    assert data.record()["data_folder"] == str(three_classes.resolve())
    # and a worker reading it gets what decoding the folder itself gives, cast for the model
    copy = steps.DataCache().load_folder(data.decoded, [16, 12, 3, 3, "float32"])
    direct = folder.load(folder.scan(three_classes), 16, 12, 3, dtype="float32").split
    assert copy.images.dtype == np.float32 and np.array_equal(copy.images, direct.images)
    assert copy.labels.tolist() == direct.labels.tolist() and copy.files == direct.files
    # and a copy left by a run that died (its process gone) is removed by the next run; this one's stays
    orphan = tmp_path / "work" / f"999999999-f-16x12x3{folder.DECODED_SUFFIX}"
    orphan.write_bytes(b"left by a killed run")
    again = model_check.data_for(info, tmp_path, three_classes, tmp_path / "work")
    assert not orphan.exists() and Path(again.decoded).exists() and again.decoded.startswith(str(tmp_path))


def test_a_race_holds_out_the_test_tenth_then_a_tenth_of_the_rest_to_validate():
    from catsdogs.data.loading import Split

    # given 120 images
    images = Split(np.arange(120, dtype=np.uint8).reshape(120, 1, 1, 1), np.arange(120) % 3, [f"{i}.png" for i in range(120)])
    # when a race splits them
    train, validation, test = folder.race_splits(images)
    # then the test tenth is the one every other use of the folder holds out, and validation a tenth of the rest
    assert test.files == folder.holdout(images)[1].files
    assert (len(train), len(validation), len(test)) == (97, 11, 12) == (folder.race_train_count(120), 11, 12)
    assert not {*train.files} & {*validation.files} and not ({*train.files} | {*validation.files}) & {*test.files}

