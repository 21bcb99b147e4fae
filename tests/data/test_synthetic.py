"""The synthetic PetImages stand-in: layout, determinism, and bad files that really are bad."""

from __future__ import annotations

import hashlib
import io
import zipfile
from itertools import pairwise
from pathlib import Path

import pytest
from PIL import Image, ImageFile, UnidentifiedImageError

from catsdogs.data.synthetic import (
    BAD_KINDS,
    LICENSE_NAME,
    N_BAD,
    ODD_KINDS,
    ODD_MODES,
    README_NAME,
    make_synthetic_archive,
)

N_VALID = 12


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("synthetic") / "pets.zip"
    kinds = make_synthetic_archive(path, N_VALID, seed=0)
    return path, kinds


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read(name)


def _members_of_kind(kinds: dict[str, str], kind: str) -> list[str]:
    return sorted(name for name, k in kinds.items() if k == kind)


def test_given_same_seed_when_generated_twice_then_bytes_are_identical(
    archive: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    # Given: the module's archive, made with seed 0
    first, first_kinds = archive
    # When: the same archive is generated again elsewhere
    again = tmp_path / "again.zip"
    again_kinds = make_synthetic_archive(again, N_VALID, seed=0)
    # Then: the bytes and the kind map are the same
    assert _sha256(again) == _sha256(first)
    assert again_kinds == first_kinds


def test_given_other_seed_when_generated_then_bytes_differ(
    archive: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    # Given: the module's archive, made with seed 0
    first, _ = archive
    # When: an archive with the same size but seed 1 is made
    other = tmp_path / "other.zip"
    make_synthetic_archive(other, N_VALID, seed=1)
    # Then: its bytes differ, and so does an ordinary image in it
    assert _sha256(other) != _sha256(first)
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(other) as b:
        differing = [n for n in a.namelist() if n.endswith(".jpg") and a.read(n) != b.read(n)]
    assert len(differing) >= N_VALID


def test_given_archive_when_listed_then_layout_matches_petimages(
    archive: tuple[Path, dict[str, str]],
) -> None:
    # Given: a synthetic archive with 12 valid images per class
    path, kinds = archive
    # When: its member names are listed
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    # Then: each class folder holds 0..n+3 .jpg and a Thumbs.db, and the two top-level files
    for cls in ("Cat", "Dog"):
        jpgs = {n for n in names if n.startswith(f"PetImages/{cls}/") and n.endswith(".jpg")}
        assert jpgs == {f"PetImages/{cls}/{i}.jpg" for i in range(N_VALID + N_BAD)}
        assert f"PetImages/{cls}/Thumbs.db" in names
        assert kinds[f"PetImages/{cls}/Thumbs.db"] == "thumbs-db"
    assert LICENSE_NAME in names and README_NAME in names
    assert "synthetic" in _read(path, README_NAME).decode()
    assert "catsdogs" in _read(path, LICENSE_NAME).decode()
    assert len(names) == 2 * (N_VALID + N_BAD + 1) + 2
    # and no file lies outside PetImages/ except the two placeholders
    assert {n for n in names if not n.startswith("PetImages/")} == {LICENSE_NAME, README_NAME}


def test_given_archive_when_kinds_counted_then_each_special_kind_once_per_class(
    archive: tuple[Path, dict[str, str]],
) -> None:
    # Given / When: the kind map that generation returned
    _, kinds = archive
    # Then: per class, every bad and odd kind appears exactly once, on a .jpg name
    for cls in ("Cat", "Dog"):
        in_class = {n: k for n, k in kinds.items() if n.startswith(f"PetImages/{cls}/")}
        jpg_kinds = sorted(k for n, k in in_class.items() if n.endswith(".jpg"))
        assert jpg_kinds == sorted(BAD_KINDS + ODD_KINDS)
        # and no two special names are adjacent numbers
        indices = sorted(int(Path(n).stem) for n in in_class if n.endswith(".jpg"))
        assert all(b - a >= 2 for a, b in pairwise(indices))


def test_given_archive_when_every_jpg_loaded_then_exactly_n_valid_decode_per_class(
    archive: tuple[Path, dict[str, str]],
) -> None:
    # Given: the archive
    path, kinds = archive
    # When: every .jpg is opened and fully loaded
    decoded = {"Cat": 0, "Dog": 0}
    failed = set()
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            if not name.endswith(".jpg"):
                continue
            try:
                with Image.open(io.BytesIO(zf.read(name))) as im:
                    im.load()
                decoded[name.split("/")[1]] += 1
            except (OSError, Image.DecompressionBombError):
                failed.add(name)
    # Then: n_valid decode per class, and the failures are exactly the bad kinds
    assert decoded == {"Cat": N_VALID, "Dog": N_VALID}
    assert failed == {n for n, k in kinds.items() if k in BAD_KINDS}


@pytest.mark.parametrize(
    ("kind", "min_bytes", "max_bytes", "error"),
    [
        ("empty", 0, 0, UnidentifiedImageError),  # zero bytes
        ("not-image", 1, None, UnidentifiedImageError),  # bytes, but no image format
        ("thumbs-db", 100, 2_000, UnidentifiedImageError),  # a small non-image binary
        # a small file that claims far more pixels than Pillow allows
        ("bomb", 0, 99_999, Image.DecompressionBombError),
    ],
)
def test_given_an_unopenable_member_then_it_has_its_size_and_pillow_refuses_to_open_it(
    archive: tuple[Path, dict[str, str]], kind: str, min_bytes: int, max_bytes: int | None, error: type
) -> None:
    path, kinds = archive
    names = _members_of_kind(kinds, kind)
    assert names
    for name in names:
        # When: it is read and opened
        data = _read(path, name)
        # Then: its size is the kind's, and Pillow refuses it with the kind's error
        assert min_bytes <= len(data) and (max_bytes is None or len(data) <= max_bytes)
        with pytest.raises(error):
            Image.open(io.BytesIO(data))


def test_given_truncated_jpeg_then_verify_passes_but_load_fails(
    archive: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: truncated images are not tolerated (Pillow's default)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    path, kinds = archive
    names = _members_of_kind(kinds, "truncated")
    assert len(names) == 2
    for name in names:
        data = _read(path, name)
        # When: verified, then fully loaded
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "JPEG"
            im.verify()  # Then: verify() lets it through, as with the real truncated files
        with Image.open(io.BytesIO(data)) as im, pytest.raises(OSError, match="truncated"):
            im.load()  # but a full decode fails


@pytest.mark.parametrize("kind", ODD_KINDS)
def test_given_odd_member_then_it_decodes_in_its_mode(
    archive: tuple[Path, dict[str, str]], kind: str
) -> None:
    path, kinds = archive
    names = _members_of_kind(kinds, kind)
    assert len(names) == 2  # one per class
    for name in names:
        # When: loaded
        with Image.open(io.BytesIO(_read(path, name))) as im:
            im.load()
            # Then: it has the claimed mode and format, and converts to RGB
            assert im.mode == ODD_MODES[kind]
            assert im.format == ("PNG" if kind.endswith("png") else "JPEG")
            assert im.convert("RGB").size == im.size


def test_given_ordinary_images_then_sizes_and_aspect_ratios_vary(
    archive: tuple[Path, dict[str, str]],
) -> None:
    # Given: the ordinary (unlisted) .jpg members
    path, kinds = archive
    sizes = []
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            if name.endswith(".jpg") and name not in kinds:
                # When: each is opened
                with Image.open(io.BytesIO(zf.read(name))) as im:
                    assert (im.format, im.mode) == ("JPEG", "RGB")
                    sizes.append(im.size)
    # Then: there are 2 * (n_valid - 4) of them, within 100-500 px, and shapes vary
    assert len(sizes) == 2 * (N_VALID - len(ODD_KINDS))
    assert all(100 <= s <= 500 for wh in sizes for s in wh)
    ratios = [w / h for w, h in sizes]
    assert min(ratios) < 0.8 and max(ratios) > 1.25
    assert len(set(sizes)) > len(sizes) // 2


def test_given_existing_path_when_generated_then_replaced_atomically_without_leftovers(
    tmp_path: Path,
) -> None:
    # Given: a stale file where the archive goes
    path = tmp_path / "pets.zip"
    path.write_bytes(b"stale")
    # When: the archive is generated there
    make_synthetic_archive(path, 4, seed=3)
    # Then: it is a complete zip, and no temporary file is left beside it
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pets.zip"]


def test_given_too_few_valid_images_when_generated_then_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_valid"):
        make_synthetic_archive(tmp_path / "x.zip", 3)
    assert not (tmp_path / "x.zip").exists()
