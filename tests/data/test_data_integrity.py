"""Prepared data that changed after `prepare` wrote it is noticed (issue 32): prepare rebuilds what
changed, `prepare --force` rebuilds everything, and every stage that trains refuses data whose
files no longer match their manifest, naming a file and the fix."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs.cli import cli
from catsdogs.data.prepare import prepare
from catsdogs.errors import CatsdogsError
from catsdogs.manifest import changed_files, load_manifest, require_intact

PARAMS = {"per_class": 20, "split": (12, 4, 4), "size": 32, "sha256": None}


def run(data: Path, source, **kw) -> tuple[dict, list[str]]:
    lines: list[str] = []
    manifest = prepare(source=str(source), data_dir=data, log=lines.append, progress=False, **{**PARAMS, **kw})
    return manifest, lines


def digests(data: Path) -> dict[str, str]:
    return {str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in ("standard", "augmented") for p in sorted((data / d).rglob("*.jpg"))}


def swap_cats_for_dogs(data: Path) -> list[str]:
    """Every train/Cat image replaced by a Dog image (a new file under the old name)."""
    cats = sorted((data / "standard/train/Cat").glob("*.jpg"))
    dogs = sorted((data / "standard/train/Dog").glob("*.jpg"))
    for cat, dog in zip(cats, dogs, strict=False):
        tmp = cat.with_suffix(".tmp")
        tmp.write_bytes(dog.read_bytes())
        os.replace(tmp, cat)
    return [str(c.relative_to(data)) for c in cats]


@pytest.fixture
def prepared(small_archive, tmp_path) -> tuple[Path, dict, str]:
    data = tmp_path / "data"
    manifest, _ = run(data, small_archive.path)
    return data, manifest, str(small_archive.path)


def test_given_swapped_images_when_preparing_again_then_only_they_are_rebuilt_and_match_the_manifest(prepared):
    # given a prepared folder whose train/Cat images became Dog images
    data, manifest, source = prepared
    before = digests(data)
    untouched = data / "standard/validation/Dog" / manifest["chosen"]["Dog"]["validation"][0]
    untouched_inode = untouched.stat().st_ino
    swapped = swap_cats_for_dogs(data)
    assert sorted(changed_files(data, manifest)) == sorted(swapped)
    # when the same prepare runs again
    again, lines = run(data, source)
    # then it said so, rebuilt those files only, and the folder is as the manifest records it
    assert not any("nothing to do" in line for line in lines)
    assert any(f"{len(swapped)} prepared file(s) changed" in line for line in lines)
    assert digests(data) == before and changed_files(data, again) == []
    assert again == manifest == load_manifest(data)
    assert untouched.stat().st_ino == untouched_inode  # not rewritten


def test_given_an_image_overwritten_with_random_bytes_when_sweeping_then_it_is_refused_naming_it(prepared, tmp_path):
    # given one prepared image overwritten in place with random bytes
    data, manifest, _ = prepared
    victim = data / "standard/test/Dog" / manifest["chosen"]["Dog"]["test"][0]
    victim.write_bytes(os.urandom(victim.stat().st_size))
    # when a sweep is planned (a dry run too), then it is refused in one line naming the file and the fix
    result = CliRunner().invoke(cli, ["sweep", "--data-dir", str(data), "--out", str(tmp_path / "out"),
                                      "--opt", "adam", "--batch-size", "4", "--dry-run"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and str(victim) in result.output
    assert "catsdogs prepare" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "results.sqlite").exists()
    with pytest.raises(CatsdogsError, match=str(victim)):
        require_intact(data)


def test_given_a_changed_image_when_profiling_then_it_is_refused_before_any_worker(prepared, tmp_path):
    data, manifest, _ = prepared
    (data / "standard/train/Cat" / manifest["chosen"]["Cat"]["train"][0]).write_bytes(b"not a jpeg")
    result = CliRunner().invoke(cli, ["profile", "--data-dir", str(data), "--out", str(tmp_path / "out"),
                                      "--batch-size", "2"])
    assert result.exit_code == 1 and "changed since `catsdogs prepare` wrote it" in result.output
    assert "Traceback" not in result.output


def test_given_force_when_preparing_then_everything_is_rebuilt_to_the_same_fingerprint(prepared):
    # given an untouched prepared folder
    data, manifest, source = prepared
    inode = (data / "standard/train/Cat" / manifest["chosen"]["Cat"]["train"][0]).stat().st_ino
    # when prepared again with force
    again, lines = run(data, source, force=True)
    # then it did the work (new files), and the same images came out
    assert not any("nothing to do" in line for line in lines)
    assert (data / "standard/train/Cat" / manifest["chosen"]["Cat"]["train"][0]).stat().st_ino != inode
    assert again["fingerprint"] == manifest["fingerprint"] and again["files"] == manifest["files"]


def test_given_force_on_the_command_line_when_preparing_then_it_rebuilds(prepared):
    data, _, source = prepared
    args = ["prepare", "--source", source, "--no-verify", "--data-dir", str(data), "--per-class", "20",
            "--split", "12,4,4", "--size", "32", "--quiet"]
    assert "nothing to do" in CliRunner().invoke(cli, args).output
    result = CliRunner().invoke(cli, [*args, "--force"])
    assert result.exit_code == 0 and "nothing to do" not in result.output and "Prepared 40 images" in result.output


def test_given_a_manifest_without_file_digests_when_preparing_then_they_are_added_if_the_files_match(prepared):
    # given a folder prepared by 0.10.0: its manifest has fingerprints but no per-file digests
    data, manifest, source = prepared
    old = {k: v for k, v in manifest.items() if k != "files"}
    (data / "manifest.json").write_text(json.dumps(old))
    assert changed_files(data, old) == []
    # when prepared again, then nothing is rebuilt and the digests are recorded
    _, lines = run(data, source)
    assert any("nothing to do" in line for line in lines)
    assert load_manifest(data)["files"] == manifest["files"]


def test_given_a_manifest_without_file_digests_and_a_changed_file_then_its_data_set_is_reported_changed(prepared):
    data, manifest, source = prepared
    old = {k: v for k, v in manifest.items() if k != "files"}
    (data / "manifest.json").write_text(json.dumps(old))
    victim = "augmented/train/Dog/augmented_" + manifest["chosen"]["Dog"]["train"][0]
    (data / victim).write_bytes(b"changed")
    changed = changed_files(data, old)
    assert victim in changed and not any(c.startswith("standard/train/") for c in changed)
    # and prepare, which cannot rebuild file by file without digests, prepares everything again
    again, lines = run(data, source)
    assert any("preparing everything again" in line for line in lines)
    assert again["fingerprint"] == manifest["fingerprint"] and changed_files(data, again) == []
