"""`catsdogs prepare`: from a (synthetic) source archive to the article's folders.

Every test is read as given / when / then. Sizes are small (32-64 px, 20-24 images per class)
so the file runs in seconds; the synthetic archive comes from tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from catsdogs import config
from catsdogs.cli import cli
from catsdogs.data import prepare as prep_module
from catsdogs.data.prepare import prepare
from catsdogs.errors import ArchiveError, CatsdogsError, ChecksumError, DownloadError
from catsdogs.manifest import load_manifest, require_prepared

CLASSES = config.CLASSES
SPLITS = config.SPLIT_NAMES
AUG_SPLITS = ("train", "validation")

# What a rejection reason must say for each bad kind the synthetic archive plants.
REASON_WORDS = {
    "empty": ("empty", "0 bytes"),
    "truncated": ("truncated",),
    "not-image": ("not an image",),
    "bomb": ("decompression bomb",),
    "thumbs-db": ("not a .jpg",),
}


# --- helpers -----------------------------------------------------------------------------------



def folder_fingerprint(root: Path, dirs: list[str]) -> str:
    """The data fingerprint as 0.9.0 defined it, computed here from the files on disk."""
    h = hashlib.sha256()
    for d in dirs:
        for p in sorted((root / d).rglob("*.jpg")):
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()

def run(data_dir: Path, source, **kw) -> tuple[dict, list[str]]:
    """prepare() quietly; return the manifest and the lines it logged."""
    lines: list[str] = []
    kw.setdefault("sha256", None)
    manifest = prepare(source=str(source), data_dir=data_dir, log=lines.append, progress=False, **kw)
    return manifest, lines


def rel(member: str) -> str:
    """'PetImages/Cat/6.jpg' -> 'Cat/6.jpg', the name the manifest uses."""
    return member.split("PetImages/", 1)[1]


def jpgs(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix == ".jpg"} if folder.is_dir() else set()


def split_of(manifest: dict, cls: str, name: str) -> str | None:
    for s in SPLITS:
        if name in manifest["chosen"][cls][s]:
            return s
    return None


def mtimes(data_dir: Path) -> dict[str, int]:
    paths = [data_dir / "manifest.json", *data_dir.glob("standard/**/*"), *data_dir.glob("augmented/**/*")]
    return {str(p.relative_to(data_dir)): p.stat().st_mtime_ns for p in paths}


def assert_folders_match_manifest(data_dir: Path, manifest: dict, size: int) -> None:
    """Every folder holds exactly the manifest's chosen files, as size x size RGB JPEGs."""
    for c in CLASSES:
        for s in SPLITS:
            names = set(manifest["chosen"][c][s])
            assert len(names) == len(manifest["chosen"][c][s])  # no name chosen twice
            assert jpgs(data_dir / "standard" / s / c) == names, (s, c)
            assert manifest["counts"]["standard"][s][c] == len(names)
            if s in AUG_SPLITS:
                aug = jpgs(data_dir / "augmented" / s / c)
                assert aug == names | {f"augmented_{n}" for n in names}, (s, c)
                assert manifest["counts"]["augmented"][s][c] == 2 * len(names)
    assert not (data_dir / "augmented" / "test").exists()
    for p in [*data_dir.glob("standard/*/*/*"), *data_dir.glob("augmented/*/*/*")]:
        with Image.open(p) as im:
            assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (size, size)), p


def assert_never_half_finished(data_dir: Path) -> None:
    """Either no finished prepare is visible, or the visible one matches the files exactly."""
    manifest = load_manifest(data_dir)
    if manifest is None:
        with pytest.raises(CatsdogsError):
            require_prepared(data_dir)
        return
    assert_folders_match_manifest(data_dir, manifest, manifest["params"]["size"])


def one_error_line(result) -> str:
    """The CLI's stderr must be exactly one non-empty line, starting with 'Error:'."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error:"), lines[0]
    return lines[0]


# --- 1. bad and odd images ---------------------------------------------------------------------


def test_given_every_bad_kind_when_preparing_then_each_is_rejected_with_its_reason(small_archive, tmp_path):
    # given: a per-class count equal to the valid images, so every candidate gets decoded
    n = small_archive.n_valid

    # when
    manifest, lines = run(tmp_path / "data", small_archive.path, per_class=n, split=(12, 6, 6), size=40)

    # then: every bad member is rejected, with a reason that names what is wrong with it
    rejected = {r["file"]: r["reason"] for r in manifest["rejected"]}
    bad = {m: k for m, k in small_archive.kinds.items() if k in REASON_WORDS}
    assert len(bad) == 2 * len(REASON_WORDS)  # four bad images and a Thumbs.db per class
    for member, kind in bad.items():
        reason = rejected.get(rel(member), "")
        assert any(word in reason for word in REASON_WORDS[kind]), (member, kind, reason)
    assert len(rejected) == len(bad)  # nothing good was rejected
    # every .jpg name was decoded
    assert manifest["checked"] == {c: len(list((small_archive.pets / c).glob("*.jpg"))) for c in CLASSES}
    # and a one-line summary says how many were rejected
    summary = [line for line in lines if line.startswith("Prepared")]
    assert len(summary) == 1 and f"rejected {len(bad)}" in summary[0]


def test_given_grayscale_cmyk_palette_and_alpha_images_when_preparing_then_they_are_kept_as_rgb(small_archive, tmp_path):
    # given: the odd-but-valid images of the synthetic archive (an L, CMYK, P and RGBA source each)
    n, size = small_archive.n_valid, 40
    odd = small_archive.members_of_kind("grayscale", "cmyk", "palette-png", "rgba-png")
    assert len(odd) == 8

    # when
    manifest, _ = run(tmp_path / "data", small_archive.path, per_class=n, split=(12, 6, 6), size=size)

    # then: each was chosen and written as an RGB JPEG of the right size (twice, if augmented)
    assert manifest["source_modes"] == {"RGB": 2 * n - 8, "L": 2, "CMYK": 2, "P": 2, "RGBA": 2}
    rejected = {r["file"] for r in manifest["rejected"]}
    for member in odd:
        cls, name = rel(member).split("/")
        assert rel(member) not in rejected
        s = split_of(manifest, cls, name)
        assert s is not None, member
        outs = [tmp_path / "data" / "standard" / s / cls / name]
        if s in AUG_SPLITS:
            outs += [tmp_path / "data" / "augmented" / s / cls / p for p in (name, f"augmented_{name}")]
        for out in outs:
            with Image.open(out) as im:
                assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (size, size)), out


# --- 2. the article's pixels --------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, window",
    [(40, None), (48, None), (40, 4)],
    # 40 -> 50 crops a whole-pixel box (as 200 -> 250 does), 48 -> 60 does not; a narrow
    # window submits the last candidates once train and validation are full, so they skip
    # the augmented copy a test image does not need
    ids=["size-40", "size-48", "size-40-narrow-window"],
)
def test_given_the_articles_load_and_save_when_comparing_bytes_then_every_prepared_file_is_identical(small_archive, tmp_path, monkeypatch, size, window):
    # given: a prepare that keeps every valid image (odd modes included), and the article's calls
    keras = pytest.importorskip("keras")
    big = (int(size * config.AUGMENT_SCALE),) * 2  # a whole number here, as 200 -> 250 is
    data = tmp_path / "data"
    augment_flags: list[bool] = []
    to_pending: list[bool] = []  # written to the pending folder (split not yet certain) or in place
    if window:
        wide_in_order = prep_module.in_order

        def narrow_in_order(pool, items, args_of, **kw):
            def spy(name, ahead):
                args = args_of(name, ahead)
                augment_flags.append(args[3])  # process_and_write(path, size, max_pixels, augment, targets)
                to_pending.append("/.pending/" in args[4][0])
                return args

            return wide_in_order(pool, items, spy, **{**kw, "window": window})

        monkeypatch.setattr(prep_module, "in_order", narrow_in_order)
    manifest, _ = run(data, small_archive.path, per_class=small_archive.n_valid, split=(12, 6, 6), size=size)
    if window:
        assert False in augment_flags and True in augment_flags
        assert False in to_pending and True in to_pending  # both ways of placing files are checked
    ref = tmp_path / "ref.jpg"

    def article_bytes(img) -> bytes:
        keras.utils.save_img(ref, img)
        return ref.read_bytes()

    # when / then: for every chosen image, our bytes are exactly what the article's code writes
    compared = 0
    for c in CLASSES:
        for s in SPLITS:
            for name in manifest["chosen"][c][s]:
                photo = keras.utils.load_img(small_archive.pets / c / name, target_size=(size, size))
                standard = article_bytes(photo)
                assert (data / "standard" / s / c / name).read_bytes() == standard, (c, s, name)
                if s in AUG_SPLITS:
                    augmented = article_bytes(photo.resize(big).crop((0, 0, size, size)))
                    assert (data / "augmented" / s / c / name).read_bytes() == standard
                    assert (data / "augmented" / s / c / f"augmented_{name}").read_bytes() == augmented
                compared += 1
    assert compared == 2 * small_archive.n_valid


# --- 3. idempotency -----------------------------------------------------------------------------


def test_given_a_finished_prepare_when_run_again_with_the_same_parameters_then_nothing_is_rewritten(small_archive, tmp_path):
    # given
    data = tmp_path / "data"
    params = {"per_class": 20, "split": (12, 4, 4), "size": 32}
    first, _ = run(data, small_archive.path, **params)
    before = mtimes(data)
    time.sleep(0.02)  # so a rewrite would show in the nanosecond mtimes

    # when
    second, lines = run(data, small_archive.path, **params)

    # then: it says so, returns the same manifest, and touched no file
    assert any("nothing to do" in line for line in lines), lines
    assert second == first
    assert mtimes(data) == before


def test_given_a_killed_prepares_leftovers_when_nothing_is_to_do_then_they_are_removed(small_archive, tmp_path):
    # given a finished prepare, and what a prepare killed since left beside it
    data = tmp_path / "data"
    params = {"per_class": 20, "split": (12, 4, 4), "size": 32}
    run(data, small_archive.path, **params)
    leftovers = [data / ".staging-1a2b3c4d" / "standard", data / "extracted" / ".tmp-abc-123"]
    for folder in leftovers:
        folder.mkdir(parents=True)
        (folder / "half.jpg").write_bytes(b"half")
    # when the same prepare runs again, with nothing to do
    _, lines = run(data, small_archive.path, **params)
    # then it removed them (no prepare was running), and rebuilt nothing
    assert any("nothing to do" in line for line in lines)
    assert not (data / ".staging-1a2b3c4d").exists() and not leftovers[1].exists()


@pytest.mark.parametrize("manifest", ["null", "[1, 2, 3]", '{"complete": true, "format": 1, "fingerprint": 12345}'],
                         ids=["null", "list", "fingerprint"])
def test_given_a_manifest_of_another_shape_when_preparing_then_it_is_rebuilt(small_archive, tmp_path, manifest):
    # given a finished prepare whose manifest.json became valid JSON that is no manifest
    data = tmp_path / "data"
    params = {"per_class": 20, "split": (12, 4, 4), "size": 32}
    first, _ = run(data, small_archive.path, **params)
    (data / "manifest.json").write_text(manifest)
    assert load_manifest(data) is None
    # when prepared again, then it is rebuilt (the same choice), not a crash
    second, lines = run(data, small_archive.path, **params)
    assert not any("nothing to do" in line for line in lines)
    assert second["chosen"] == first["chosen"] and load_manifest(data) == second


@pytest.mark.parametrize("change", [{"size": 40}, {"seed": 1}], ids=["size", "seed"])
def test_given_a_finished_prepare_when_a_parameter_changes_then_it_rebuilds(small_archive, tmp_path, change):
    # given
    data = tmp_path / "data"
    params = {"per_class": 20, "split": (12, 4, 4), "size": 32, "seed": 0}
    first, _ = run(data, small_archive.path, **params)

    # when
    second, lines = run(data, small_archive.path, **{**params, **change})

    # then: it did the work again, and the folders follow the new parameters
    assert not any("nothing to do" in line for line in lines)
    for key, value in change.items():
        assert second["params"][key] == value
    assert second["fingerprint"] != first["fingerprint"]
    assert load_manifest(data) == second
    assert_folders_match_manifest(data, second, second["params"]["size"])


# --- 4. seeded choice and split -----------------------------------------------------------------


def test_given_the_same_seed_when_preparing_twice_in_different_folders_then_the_choice_and_split_are_the_same(small_archive, tmp_path):
    # given: more valid images (24) than are chosen (20), so there is a choice to make
    params = {"per_class": 20, "split": (12, 4, 4), "size": 32}

    # when
    a, _ = run(tmp_path / "a", small_archive.path, seed=3, **params)
    b, _ = run(tmp_path / "b", small_archive.path, seed=3, **params)
    other, _ = run(tmp_path / "c", small_archive.path, seed=4, **params)

    # then: the same seed gives the same files in the same splits, byte for byte
    assert a["chosen"] == b["chosen"]
    assert a["fingerprint"] == b["fingerprint"]
    # and another seed another choice
    def picked(m: dict, c: str) -> set[str]:
        return {n for s in SPLITS for n in m["chosen"][c][s]}

    assert all(picked(other, c) != picked(a, c) for c in CLASSES)


# --- 5. layout, counts and sizes ----------------------------------------------------------------


def test_given_a_split_when_preparing_then_every_folder_holds_the_right_count_of_right_sized_images(small_archive, tmp_path):
    # given
    data, size, split = tmp_path / "data", 36, (10, 6, 4)

    # when
    manifest, _ = run(data, small_archive.path, per_class=sum(split), split=split, size=size)

    # then: the article's layout, labels by folder name, counts per split and class
    assert {"standard", "augmented", "manifest.json"} <= {p.name for p in data.iterdir()}
    assert sorted(p.name for p in (data / "standard").iterdir()) == sorted(SPLITS)
    assert sorted(p.name for p in (data / "augmented").iterdir()) == sorted(AUG_SPLITS)
    assert manifest["labels"] == {"Cat": 0, "Dog": 1}
    for c in CLASSES:
        for s, n in zip(SPLITS, split, strict=True):
            assert sorted(p.name for p in (data / "standard" / s).iterdir()) == ["Cat", "Dog"]
            assert len(jpgs(data / "standard" / s / c)) == n
            if s in AUG_SPLITS:
                aug = jpgs(data / "augmented" / s / c)
                assert len(aug) == 2 * n
                assert sum(name.startswith("augmented_") for name in aug) == n
                # the augmented folder's originals are the standard files, hard-linked
                for name in manifest["chosen"][c][s]:
                    assert (data / "augmented" / s / c / name).samefile(data / "standard" / s / c / name)
    # no file chosen twice, none in two splits, and every file is size x size RGB
    for c in CLASSES:
        all_names = [n for s in SPLITS for n in manifest["chosen"][c][s]]
        assert len(all_names) == len(set(all_names)) == sum(split)
    assert_folders_match_manifest(data, manifest, size)
    assert manifest["params"]["split"] == list(split)
    # and the fingerprints name exactly the bytes on disk
    assert manifest["fingerprint"] == {
        "standard": folder_fingerprint(data, ["standard"]),
        "augmented": folder_fingerprint(data, ["augmented", "standard/test"]),
    }
    assert {"python", "pillow", "numpy"} <= set(manifest["versions"])
    # and each file's digest is its bytes'
    on_disk = sorted(str(p.relative_to(data)) for d in ("standard", "augmented") for p in (data / d).rglob("*.jpg"))
    assert sorted(manifest["files"]) == on_disk
    assert all(hashlib.sha256((data / rel).read_bytes()).hexdigest() == h for rel, h in manifest["files"].items())


# --- 6. safety ----------------------------------------------------------------------------------


def zip_with(path: Path, small_archive, extra_member: str) -> Path:
    """A copy of the small archive's PetImages tree plus one extra (hostile) member."""
    with zipfile.ZipFile(small_archive.path) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        info = zipfile.ZipInfo("placeholder")
        info.filename = extra_member  # bypass any name clean-up, as a hostile tool would
        dst.writestr(info, b"evil")
    with zipfile.ZipFile(path) as zf:
        assert extra_member in zf.namelist()
    return path


@pytest.mark.parametrize("member", ["../evil.txt", "PetImages/../../evil.txt", "ABSOLUTE"])
def test_given_a_member_that_escapes_the_folder_when_extracting_then_archive_error_and_nothing_outside(small_archive, tmp_path, member):
    # given: a zip with a member that would land outside the extraction folder
    target = tmp_path / "outside" / "evil.txt"
    if member == "ABSOLUTE":
        member = str(target)
    archive = zip_with(tmp_path / "hostile.zip", small_archive, member)
    data = tmp_path / "outside" / "inside" / "data"

    # when / then
    with pytest.raises(ArchiveError, match="unsafe path"):
        run(data, archive, per_class=20, split=(12, 4, 4), size=32)
    written = [p for p in tmp_path.rglob("evil.txt")]
    assert written == []
    assert not target.exists()
    assert load_manifest(data) is None
    assert not (data / "standard").exists()
    assert not (data / "extracted").exists() or list((data / "extracted").iterdir()) == []


def test_given_a_symbolic_link_in_the_archive_when_extracting_then_archive_error_and_no_link(small_archive, tmp_path):
    # given: a zip whose member is a symbolic link to a file outside the data folder (as `zip
    # --symlinks` stores one: the link's target as the member's bytes, S_IFLNK in its mode)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    archive = tmp_path / "links.zip"
    with zipfile.ZipFile(small_archive.path) as src, zipfile.ZipFile(archive, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        link = zipfile.ZipInfo("PetImages/Cat/link.jpg")
        link.external_attr = (0o120777 << 16)  # a symbolic link, rwx for all
        dst.writestr(link, str(secret))
    data = tmp_path / "data"

    # when / then: the whole archive is refused, and no link was made
    with pytest.raises(ArchiveError, match="symbolic link in archive, refusing to extract: 'PetImages/Cat/link.jpg'"):
        run(data, archive, per_class=20, split=(12, 4, 4), size=32)
    assert [p for p in tmp_path.rglob("link.jpg")] == []
    assert load_manifest(data) is None


def test_given_a_file_that_is_not_a_zip_when_preparing_then_a_clear_archive_error(tmp_path):
    # given
    fake = tmp_path / "kagglecatsanddogs.zip"
    fake.write_bytes(b"<html>this is a login page, not an archive</html>\n" * 20)

    # when / then
    with pytest.raises(ArchiveError, match="not a zip"):
        run(tmp_path / "data", fake, per_class=20, split=(12, 4, 4), size=32)
    assert load_manifest(tmp_path / "data") is None


@pytest.mark.parametrize("sha256", ["", "not-a-hash"])
def test_given_a_malformed_sha256_when_preparing_then_an_error_not_a_silently_unverified_archive(small_archive, tmp_path, sha256):
    # given / when / then: an empty hash must not pass for a verified one
    with pytest.raises(CatsdogsError, match="64 hexadecimal"):
        run(tmp_path / "data", small_archive.path, sha256=sha256, per_class=20, split=(12, 4, 4), size=32)
    assert load_manifest(tmp_path / "data") is None


def test_given_an_empty_folder_when_requiring_prepared_data_then_catsdogs_error(tmp_path):
    # given / when / then
    with pytest.raises(CatsdogsError, match="prepare"):
        require_prepared(tmp_path)


def test_given_a_manifest_whose_files_went_missing_when_loading_then_it_is_not_taken_as_finished(small_archive, tmp_path):
    # given: a finished prepare, then one file deleted behind its back
    data = tmp_path / "data"
    manifest, _ = run(data, small_archive.path, per_class=20, split=(12, 4, 4), size=32)
    victim = data / "standard" / "test" / "Dog" / manifest["chosen"]["Dog"]["test"][0]
    victim.unlink()

    # when / then: not finished, and a re-run rebuilds instead of saying nothing to do
    assert load_manifest(data) is None
    again, lines = run(data, small_archive.path, per_class=20, split=(12, 4, 4), size=32)
    assert not any("nothing to do" in line for line in lines)
    assert victim.exists() and again["chosen"] == manifest["chosen"]


def test_given_unchanged_class_folders_when_loading_again_then_their_files_are_not_listed_until_one_changes(
        small_archive, tmp_path, monkeypatch):
    from catsdogs import manifest as manifest_module

    # given: a finished prepare whose folders were last changed long before (older than the racy window)
    data = tmp_path / "data"
    manifest, _ = run(data, small_archive.path, per_class=20, split=(12, 4, 4), size=32)
    past = time.time() - 60
    for folder in (p for p in data.rglob("*") if p.is_dir()):
        os.utime(folder, (past, past))
    listed = []
    monkeypatch.setattr(manifest_module, "count_files", lambda root, count=manifest_module.count_files:
                        listed.append(root) or count(root))

    # when it is loaded three times
    loads = [load_manifest(data) for _ in range(3)]
    # then its files were listed once, and each load is the finished manifest
    assert len(listed) == 1 and all(m == manifest for m in loads)

    # when a file goes missing behind its back, then the next load lists again and is not taken as finished
    victim = data / "standard" / "train" / "Cat" / manifest["chosen"]["Cat"]["train"][0]
    victim.unlink()
    assert load_manifest(data) is None and len(listed) == 2
    # and a folder changed within the racy window is listed at every load (a change in the same
    # clock tick would leave its time as it was)
    assert load_manifest(data) is None and load_manifest(data) is None and len(listed) == 4


def _start(data: Path, seed: int, per_class: int = 40) -> subprocess.Popen:
    """`python -m catsdogs prepare --source synthetic` in its own session (so its workers too)."""
    args = [sys.executable, "-m", "catsdogs", "prepare", "--source", "synthetic", "--data-dir", str(data),
            "--per-class", str(per_class), "--split", f"{per_class // 2},{per_class // 4},{per_class // 4}", "--size", "64",
            "--seed", str(seed), "--quiet"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> bool:
    """kill -9 the prepare as soon as `ready()` is true; True if it was killed, False if it
    finished first. Its pool workers must then go away by themselves (no orphans)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        try:
            hit = ready()
        except OSError:  # a folder vanished between two looks: look again
            hit = False
        if hit or time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            orphans = _wait_for_group_to_end(proc.pid, seconds=10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left, so the test leaks nothing
            assert hit, "prepare ran past the test's timeout"
            assert not orphans, "prepare's workers outlived it"
            return True
        time.sleep(0.001)
    return False


def _wait_for_group_to_end(pgid: int, seconds: float) -> bool:
    """Wait until no process is left in the process group; True if some still are."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True


def _after(seconds: float):
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end


def _any(data: Path, pattern: str):
    return lambda: next(data.glob(pattern), None) is not None


def _gone_or_replaced(path: Path):
    """True once `path` no longer exists or is another folder (a new inode) than now."""
    inode = path.stat().st_ino if path.exists() else None

    def check() -> bool:
        try:
            return path.stat().st_ino != inode
        except FileNotFoundError:
            return True

    return check


def test_given_a_framework_imported_then_the_decode_processes_come_from_a_fork_server(monkeypatch):
    # given a process that has imported neither TensorFlow nor JAX
    for name in prep_module.FRAMEWORKS_WITH_THREADS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    # when / then its decode processes are forked from it
    assert prep_module._decode_context().get_start_method() == "fork"
    # and where either is imported (its threads must not be forked), from a fork server
    for name in prep_module.FRAMEWORKS_WITH_THREADS:
        monkeypatch.setitem(sys.modules, name, object())
        assert prep_module._decode_context().get_start_method() == "forkserver"
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.slow
def test_given_a_prepare_that_imported_jax_is_killed_then_its_fork_servers_decode_processes_end_too(tmp_path):
    # given a prepare run by a process that has imported JAX (as the Python API's may have), so
    # that its decode processes come from a fork server, not from it
    data = tmp_path / "data"
    script = ("import runpy, sys; import jax; sys.argv[0] = 'catsdogs'; "
              "runpy.run_module('catsdogs', run_name='__main__')")
    args = [sys.executable, "-c", script, "prepare", "--source", "synthetic", "--data-dir", str(data),
            "--per-class", "40", "--split", "20,10,10", "--size", "64", "--seed", "0", "--quiet"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # when it is killed with SIGKILL while they write images
    # then they, and the fork server, end by themselves (_kill_when asserts no process is left)
    assert _kill_when(proc, _any(data, ".*/standard/*/*/*.jpg"))
    assert_never_half_finished(data)


@pytest.mark.slow
def test_given_prepare_is_killed_at_any_moment_then_no_half_split_is_taken_as_finished(tmp_path):
    # given: a data folder, and prepares killed with SIGKILL at points spread over their run
    data = tmp_path / "data"
    fresh_points = {  # a first prepare: nothing there yet
        "generating the archive": _any(data, "downloads/*"),
        "extracting": _any(data, "extracted/*"),
        "writing images (the staging folder is a hidden one)": _any(data, ".*/standard/*/*/*.jpg"),
    }
    killed = []
    for what, ready in fresh_points.items():
        if _kill_when(_start(data, seed=0), ready):
            killed.append(what)
        assert_never_half_finished(data)
    assert _start(data, seed=0).wait(timeout=120) == 0
    manifest0 = load_manifest(data)
    assert manifest0 is not None
    started = time.monotonic()
    assert _start(data, seed=1).wait(timeout=120) == 0  # a full rebuild, timed
    duration = time.monotonic() - started

    # when: rebuilds over that finished prepare (each with a new seed) are killed while they
    # swap the new folders in, and half-way through
    rebuild_points = {
        "the old manifest is withdrawn": lambda: not (data / "manifest.json").exists(),
        "standard/ is swapped": _gone_or_replaced(data / "standard"),
        "augmented/ is swapped": _gone_or_replaced(data / "augmented"),
        "half-way": _after(duration / 2),
    }
    for i, (what, ready) in enumerate(rebuild_points.items()):
        if _kill_when(_start(data, seed=10 + i), ready):
            killed.append(what)
        # then: whatever is visible as finished matches its files exactly
        assert_never_half_finished(data)
    # (a point missed because the run outran the polling is no failure, but most must be hit)
    assert len(killed) >= len(fresh_points) + len(rebuild_points) - 2, killed

    # and a later prepare completes, consistent, with the same choice as before for seed 0
    assert _start(data, seed=0).wait(timeout=120) == 0
    manifest = load_manifest(data)
    assert manifest is not None and manifest["params"]["seed"] == 0
    assert manifest["chosen"] == manifest0["chosen"]
    assert manifest["fingerprint"] == manifest0["fingerprint"]
    assert_folders_match_manifest(data, manifest, 64)
    # and what the killed runs left half-done was cleared away
    assert [p.name for p in data.glob(".staging-*")] == []
    assert [p.name for p in data.glob("extracted/.tmp-*")] == []


# --- 7. download end to end ---------------------------------------------------------------------


def test_given_a_local_http_server_when_preparing_from_its_url_then_the_folders_are_built(small_archive, tmp_path, file_server):
    # given: the synthetic archive served at the name the real archive has
    url = file_server.serve("/kagglecatsanddogs.zip", small_archive.path.read_bytes())
    data = tmp_path / "data"

    # when
    manifest, _ = run(data, url, sha256=small_archive.sha256, per_class=20, split=(12, 4, 4), size=32)

    # then: downloaded once, verified, recorded, and prepared
    assert file_server.requests == ["/kagglecatsanddogs.zip"]
    assert (data / "downloads" / "kagglecatsanddogs.zip").read_bytes() == small_archive.path.read_bytes()
    assert manifest["source"]["kind"] == "url" and manifest["source"]["url"] == url
    assert manifest["source"]["sha256"] == small_archive.sha256
    assert manifest["source"]["verified"] is True
    assert load_manifest(data) == manifest
    assert_folders_match_manifest(data, manifest, 32)


def test_given_a_wrong_sha256_when_preparing_from_a_url_then_checksum_error_and_nothing_is_prepared(small_archive, tmp_path, file_server):
    # given
    url = file_server.serve("/kagglecatsanddogs.zip", small_archive.path.read_bytes())
    data = tmp_path / "data"
    wrong = hashlib.sha256(b"something else").hexdigest()

    # when / then: a clear error, and the bad file is kept nowhere it could be used
    with pytest.raises(ChecksumError, match="SHA-256"):
        run(data, url, sha256=wrong, per_class=20, split=(12, 4, 4), size=32)
    assert load_manifest(data) is None
    for name in ("standard", "augmented", "manifest.json", "extracted"):
        assert not (data / name).exists(), name
    assert [p.name for p in (data / "downloads").glob("*")] == []

    # and with the right hash the same folder then prepares fine
    manifest, _ = run(data, url, sha256=small_archive.sha256, per_class=20, split=(12, 4, 4), size=32)
    assert manifest["source"]["sha256"] == small_archive.sha256


def test_given_a_url_that_answers_404_when_preparing_then_download_error(tmp_path, file_server):
    # given: a server that has nothing at that path
    url = file_server.base_url + "/kagglecatsanddogs.zip"

    # when / then
    with pytest.raises(DownloadError, match="404"):
        run(tmp_path / "data", url, sha256="0" * 64, per_class=20, split=(12, 4, 4), size=32)
    assert load_manifest(tmp_path / "data") is None
    assert not (tmp_path / "data" / "standard").exists()


# --- 8. the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--per-class", "0"], "--per-class"),
        (["--split", "1,2"], "three counts"),
        (["--split", "10,10,x"], "whole numbers"),
        (["--per-class", "20", "--split", "10,5,4"], "adds up to 19"),
        (["--source", "/missing/path"], "no such file"),
        (["--size", "0"], "--size"),
        (["--sha256", ""], "64 hexadecimal digits"),
        (["--sha256", "abc123"], "64 hexadecimal digits"),
    ],
    ids=["per-class-0", "split-two-counts", "split-not-a-number", "split-sum", "missing-source", "size-0",
         "sha256-empty", "sha256-short"],
)
def test_given_a_bad_option_when_running_prepare_then_exit_2_and_one_error_line(tmp_path, args, words):
    # given
    runner = CliRunner()

    # when
    result = runner.invoke(cli, ["prepare", "--data-dir", str(tmp_path / "data"), *args])

    # then
    assert result.exit_code == 2, result.output
    assert words in one_error_line(result)
    assert not (tmp_path / "data").exists()  # nothing was started


def test_given_good_options_when_running_prepare_then_exit_0_and_a_second_run_does_nothing(tmp_path):
    # given
    runner = CliRunner()
    args = ["prepare", "--source", "synthetic", "--data-dir", str(tmp_path / "data"),
            "--per-class", "20", "--split", "12,4,4", "--size", "32", "--quiet"]

    # when
    first = runner.invoke(cli, args)
    second = runner.invoke(cli, args)

    # then
    assert first.exit_code == 0, first.output
    assert "Prepared 40 images" in first.stdout
    manifest = load_manifest(tmp_path / "data")
    assert manifest is not None and manifest["source"]["kind"] == "synthetic"
    assert second.exit_code == 0 and "nothing to do" in second.stdout


def test_given_no_verify_when_running_prepare_on_a_local_zip_then_it_says_verification_was_skipped(small_archive, tmp_path):
    # given: a local zip whose hash is not the published one
    runner = CliRunner()
    args = ["prepare", "--source", str(small_archive.path), "--data-dir", str(tmp_path / "data"),
            "--per-class", "20", "--split", "12,4,4", "--size", "32", "--quiet"]

    # when
    verified = runner.invoke(cli, args)
    skipped = runner.invoke(cli, [*args, "--no-verify"])

    # then: by default the published hash is enforced (one error line, exit 1) ...
    assert verified.exit_code == 1
    assert "SHA-256" in one_error_line(verified)
    # ... and --no-verify says it skipped the check, and records the actual hash
    assert skipped.exit_code == 0, skipped.output
    assert "verification skipped" in skipped.stderr
    manifest = load_manifest(tmp_path / "data")
    assert manifest["source"]["verified"] is False
    assert manifest["source"]["sha256"] == small_archive.sha256


def test_given_catsdogs_data_dir_when_running_prepare_without_data_dir_then_it_is_used(small_archive, tmp_path, monkeypatch):
    # given: an environment variable naming the data folder, and a working folder elsewhere
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={config.DATA_DIR_ENV: str(tmp_path / "from-env")})

    # when
    result = runner.invoke(cli, ["prepare", "--source", str(small_archive.pets), "--per-class", "20",
                                 "--split", "12,4,4", "--size", "32", "--quiet"])

    # then
    assert result.exit_code == 0, result.output
    assert load_manifest(tmp_path / "from-env") is not None
    assert not (tmp_path / config.DEFAULT_DATA_DIR).exists()


def test_given_a_file_that_is_not_a_zip_when_running_prepare_then_exit_1_and_one_error_line(tmp_path):
    # given
    fake = tmp_path / "archive.zip"
    fake.write_bytes(b"not a zip at all")
    sha = hashlib.sha256(fake.read_bytes()).hexdigest()

    # when: the hash is right, so the check that fails is the zip one
    result = CliRunner().invoke(cli, ["prepare", "--source", str(fake), "--sha256", sha,
                                      "--data-dir", str(tmp_path / "data"), "--quiet"])

    # then
    assert result.exit_code == 1
    assert "not a zip" in one_error_line(result)
