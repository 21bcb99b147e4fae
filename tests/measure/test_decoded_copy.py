"""find-batch-size's probes read the prepared data decoded once by the parent (probe_run.DecodedCopy,
loading.save_decoded), not each worker its own decoding of the JPEGs. No worker, nothing trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import recording_tasks

from catsdogs.data import folder, loading
from catsdogs.manifest import require_prepared
from catsdogs.measure.probe_run import DecodedCopy, ProbeRun
from catsdogs.measure.settings import FindSettings
from catsdogs.training import steps


def test_the_prepared_data_are_decoded_once_and_a_worker_reading_the_copy_gets_what_decoding_gives(
        prepared_data, tmp_path):
    # given prepared data
    data = prepared_data(16)
    # when the parent makes the decoded copy in the run's work folder
    copy = DecodedCopy(data, "standard", tmp_path / "work")
    path = copy.path()
    # then it is there, named as the decoded copies are (a killed run's is found and removed by the next)
    assert path.endswith(folder.DECODED_SUFFIX) and Path(path).parent == (tmp_path / "work").resolve()
    # and a worker reading it gets every split as decoding the JPEGs gives it, pixel for pixel
    _, read = steps.DataCache().load(data, "standard", decoded=path)
    decoded = loading.load_dataset(data, "standard")
    assert sorted(read) == sorted(decoded) == ["test", "train", "validation"]
    for name in decoded:
        assert read[name].images.dtype == np.uint8 and np.array_equal(read[name].images, decoded[name].images)
        assert read[name].labels.tolist() == decoded[name].labels.tolist() and read[name].files == decoded[name].files
    # and once the run lets it go, it is gone
    copy.remove()
    assert not Path(path).exists()


def test_a_copy_is_read_only_where_it_holds_the_fingerprint_the_data_have_now(prepared_data, tmp_path):
    # given prepared data, and copies of them whose pixels differ from the JPEGs' (so a read can be told apart)
    data = prepared_data(16)
    fingerprint = require_prepared(data)["fingerprint"]["standard"]
    splits = loading.load_dataset(data, "standard")
    marked = {name: loading.Split(255 - s.images, s.labels, s.files) for name, s in splits.items()}
    current = loading.save_decoded(marked, fingerprint, tmp_path / "current.decoded.npz")
    stale = loading.save_decoded(marked, "an-older-fingerprint", tmp_path / "stale.decoded.npz")
    # when a worker loads the data with each, or with a copy that is gone
    _, from_current = steps.DataCache().load(data, "standard", decoded=str(current))
    _, from_stale = steps.DataCache().load(data, "standard", decoded=str(stale))
    _, from_gone = steps.DataCache().load(data, "standard", decoded=str(tmp_path / "gone.decoded.npz"))
    # then only the copy of the data's fingerprint is read; the others decode the JPEGs
    assert np.array_equal(from_current["train"].images, 255 - splits["train"].images)
    assert np.array_equal(from_stale["train"].images, splits["train"].images)
    assert np.array_equal(from_gone["train"].images, splits["train"].images)


def test_a_copy_left_by_a_killed_run_is_removed_and_no_copy_is_made_of_data_that_are_not_prepared(
        prepared_data, tmp_path):
    # given a copy a killed run left in the work folder (its process gone)
    work = tmp_path / "work"
    work.mkdir()
    orphan = work / f"999999999-prepared-standard-0{folder.DECODED_SUFFIX}"
    orphan.write_bytes(b"left by a killed run")
    # ... and the temporary of one a killed run was writing
    unfinished = work / f".999999999-prepared-standard-0{folder.DECODED_SUFFIX}.0123abcd.tmp"
    unfinished.write_bytes(b"half written")
    # when a run makes its copy there
    mine = DecodedCopy(prepared_data(16), "standard", work).path()
    # then both are gone and this run's copy is there
    assert not orphan.exists() and not unfinished.exists() and Path(mine).exists()
    # and over a folder that holds no prepared data there is no copy (the workers say what is wrong)
    assert DecodedCopy(tmp_path / "nothing", "standard", tmp_path / "work2").path() is None
    assert not (tmp_path / "work2").exists()


def test_find_batch_sizes_probes_are_told_to_read_the_copy_and_the_run_removes_it_when_it_ends(
        prepared_data, tmp_path):
    # given find-batch-size's probes of the article's model on prepared data, their prober a stand-in
    run = ProbeRun(FindSettings("fbs"), prepared_data(16), tmp_path / "work", None, {}, lambda line: None)
    tasks = recording_tasks(run)
    # when two sizes are probed
    run.probe(1, "calibrate")
    run.probe(8, "search")
    # then each probe's task names the one copy, which is there while the run lasts
    assert tasks[0].decoded == tasks[1].decoded and Path(tasks[0].decoded).exists()
    # and it is gone once the run ends
    run.close()
    assert not Path(tasks[0].decoded).exists()


class StandInBackend:
    """What a probe's and a trial's start ask of the backend before they load the data."""

    NAME = "jax"

    def start(self):
        return "cpu"

    def device_bytes_in_use(self):
        return None

    def peak_memory(self):
        return {}

    def classify_error(self, exc):
        return "failed"

    def running_settings(self):
        return {"deterministic": True, "tf32": None}

    def compile_counts(self):
        return None


def watched_loads(monkeypatch) -> list:
    """A stand-in backend, and the data cache's loads recorded (the `decoded` each was given), each
    failing once recorded: the task's record then says the data were asked for."""
    from catsdogs.runtime import backends
    from catsdogs.training import steps

    asked = []

    def load(data_dir, dataset, expect="", decoded=None):
        asked.append(decoded)
        raise RuntimeError("the data were asked for")

    monkeypatch.setattr(backends, "current", lambda: StandInBackend())
    monkeypatch.setattr(backends, "check_settings", lambda cfg, running: None)
    monkeypatch.setattr(steps.DATA, "load", load)
    return asked


def test_a_probe_hands_its_tasks_copy_to_the_data_cache(monkeypatch, tmp_path):
    from catsdogs.messages import ProbeTask
    from catsdogs.training import probes

    # given a probe task naming a decoded copy, a stand-in backend, and the data cache watched
    asked = watched_loads(monkeypatch)
    task = ProbeTask(8, str(tmp_path), optimizer="sgd", dataset="standard", precision="float32", steps=3, warmup=1,
                     decoded=str(tmp_path / "copy.decoded.npz"))
    # when the worker runs it
    record = probes.run_probe(task)
    # then the data were asked for with the copy's path (and the stand-in's failure is the record's)
    assert asked == [str(tmp_path / "copy.decoded.npz")]
    assert record.status == "failed" and "the data were asked for" in record.error


def test_a_short_run_hands_its_tasks_copy_to_the_data_cache_and_the_noise_scale_names_it_in_every_run(
        monkeypatch, tmp_path):
    from catsdogs.measure import noise_run
    from catsdogs.measure.settings import FindSettings
    from catsdogs.messages import TrialTask
    from catsdogs.schema import TrialConfig
    from catsdogs.training import engine

    # given a trial task naming a decoded copy, a stand-in backend, and the data cache watched
    asked = watched_loads(monkeypatch)
    config = TrialConfig("sgd", 32, "standard", 0, epochs=2, image_size=64, backend="jax")
    copy = str(tmp_path / "copy.decoded.npz")
    # when a worker runs it, then the data were asked for with the copy's path
    record = engine.run_task(TrialTask(config, str(tmp_path), decoded=copy))
    assert asked == [copy] and record.status == "failed" and "the data were asked for" in record.error
    # and the noise scale's short runs name the copy find-batch-size gives them (a user's model's: none)
    tasks = []

    class Recording:
        def __init__(self, log_path, env=None):
            self.log_path = log_path

        def launch(self):
            pass

        def run(self, task):
            tasks.append(task)
            raise RuntimeError("stop here")

        def close(self):
            pass

    monkeypatch.setattr(noise_run, "Worker", Recording)
    monkeypatch.setattr(noise_run, "noise_workers", lambda user: 1)
    manifest = {"params": {"size": 64}, "fingerprint": {"standard": "f"}}
    with pytest.raises(RuntimeError, match="stop here"):
        noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(), tmp_path, None, lambda line: None,
                                      decoded=copy)
    assert [t.decoded for t in tasks] == [copy]
