"""From the source archive to the article's folders: download, extract, validate, split, resize.

    source (URL | .zip | PetImages folder | "synthetic")
      -> archive in data/downloads/  (verified SHA-256)
      -> data/extracted/<sha>/PetImages  (safe, atomic extraction)
      -> per class, a seeded order of the .jpg names, each fully decoded; the first
         `per_class` that decode are chosen and split train / validation / test
      -> data/standard/{train,validation,test}/{Cat,Dog}/, data/augmented/{train,validation}/...
      -> data/manifest.json, written last: it is the mark of a finished prepare.

The pixels are the article's: `keras.utils.load_img(target_size=...)` (convert to RGB, nearest
neighbour from the full image, aspect ratio not kept) followed by `keras.utils.save_img`, which
stretches each image's values to 0..255 (`array_to_img(scale=True)`) and saves a JPEG at
Pillow's default quality. The augmented copy is that resized image, resized to 1.25 x size with
Pillow's default filter and cropped to its top-left size x size, saved the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import itertools
import os
import re
import shutil
import sys
import threading
import time
import uuid
import warnings
import zipfile
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from catsdogs import config
from catsdogs.manifest import FORMAT, MANIFEST, count_files, load_manifest
from catsdogs.errors import ArchiveError, CatsdogsError, ChecksumError, DownloadError, SettingError
from catsdogs.files import write_json_atomic
from catsdogs.host import versions
from catsdogs.schema import check_prepare, check_sha256

WORKERS = os.cpu_count() or 1  # one decode process per core: decoding is the cost
BATCH = 8  # candidates per task sent to a worker, at most (fewer round trips)
WINDOW = WORKERS * 16  # candidates in flight, at most (what an early stop may waste)


@dataclass(frozen=True)
class PrepareParams:
    source: str  # as given: URL, path, or "synthetic"
    sha256: str | None  # the hash the archive must have; None = verification skipped
    per_class: int
    split: tuple[int, int, int]
    size: int
    seed: int

    def key(self) -> dict:
        """What must match for an existing prepared folder to be reused."""
        d = asdict(self)
        d["split"] = list(self.split)
        d["format"] = FORMAT
        d["augment_scale"] = config.AUGMENT_SCALE
        d["jpeg_quality"] = config.JPEG_QUALITY
        return d


# --- one image: the only place pixels are made -----------------------------------------------


def article_jpeg(img: Image.Image) -> bytes:
    """What keras.utils.save_img(path.jpg, img) writes: min-max stretched, JPEG at quality 75.

    keras' array_to_img stretches in float32: x - min, / max, * 255, truncated to uint8. Each
    output value depends only on the input value and the image's min and max, so those same
    float32 steps applied once to the 256 possible values give a lookup table with identical
    results (bytes included), without float copies of the whole image."""
    a = np.asarray(img)  # uint8, H x W x 3
    lut = _stretch_lut(int(a.min()), int(a.max()))
    if lut is not None:  # the same table for R, G and B, as keras stretches them together
        # Image.point() would first round all 768 entries in Python, which costs more than
        # the lookup itself; the table is already whole numbers, so hand it to the core.
        img = img._new(img.im.point(lut, None))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=config.JPEG_QUALITY)
    return buf.getvalue()


@functools.cache
def _stretch_lut(lo: int, hi: int) -> list[int] | None:
    """keras' float32 min-max stretch as an RGB table for Image.point (None if it changes nothing).

    Entries outside lo..hi are never looked up (no pixel has those values); they are 0."""
    x = np.arange(256, dtype=np.float32)[lo : hi + 1]  # the values an image with this min, max holds
    x = x - np.float32(lo)  # x - np.min(x)
    x_max = np.float32(hi - lo)  # np.max(x), exactly: small whole numbers are exact in float32
    if x_max != 0:
        x /= x_max
    x *= 255
    lut = np.zeros(256, dtype=np.uint8)
    lut[lo : hi + 1] = x.astype("uint8")
    if np.array_equal(lut[lo : hi + 1], np.arange(lo, hi + 1)):
        return None
    return lut.tolist() * 3


def resize_like_article(img: Image.Image, size: int) -> Image.Image:
    """keras.utils.load_img(target_size=(size, size)): RGB, nearest neighbour, aspect not kept."""
    if img.mode != "RGB":
        img = img.convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), Image.NEAREST)
    return img


def augment_like_article(photo: Image.Image, size: int) -> Image.Image:
    """photo.resize((big, big)).crop((0, 0, size, size)), Pillow's default filter (bicubic)."""
    big = round(size * config.AUGMENT_SCALE)
    if (size * size) % big == 0:
        # Only the top-left size x size of the big image is kept. Pillow computes each output
        # pixel's filter weights from the scale (here side / size == size / big exactly) and
        # clips its window to the whole source image, not to the box, so resizing just the
        # source box that maps onto the crop gives the same pixels with 36 % less work.
        side = size * size // big
        return photo.resize((size, size), box=(0, 0, side, side))
    return photo.resize((big, big)).crop((0, 0, size, size))


def process_image(path: str, size: int, max_pixels: int, augment: bool = True) -> tuple[str, object]:
    """Fully decode one candidate. ('ok', (standard_jpeg, augmented_jpeg, mode)) or ('rejected', reason).

    Runs in a worker process; everything it needs comes in as arguments. With augment=False
    (a candidate that can only land in the test split) augmented_jpeg is None."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return "rejected", f"unreadable: {e.strerror or e}"
    if not data:
        return "rejected", "empty file (0 bytes)"
    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow refuses at twice this in open(); we check at 1x
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # decode warnings are not failures; errors are
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                return "rejected", f"decompression bomb ({width}x{height} pixels declared)"
            img.load()  # verify() lets truncated JPEGs through; only a full decode catches them
            mode = img.mode
            photo = resize_like_article(img, size)
            standard = article_jpeg(photo)
            augmented = article_jpeg(augment_like_article(photo, size)) if augment else None
    except Image.DecompressionBombError as e:
        return "rejected", f"decompression bomb ({e})"
    except UnidentifiedImageError:
        return "rejected", "not an image Pillow can identify"
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        return "rejected", f"undecodable: {e}"
    return "ok", (standard, augmented, mode)


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def process_and_write(path: str, size: int, max_pixels: int, augment: bool,
                      targets: tuple[str, str, str]) -> tuple[str, object]:
    """process_image(), then write its JPEGs to targets = (standard, augmented folder's original,
    augmented copy); the original is a hard link to the standard file where the filesystem
    allows: creating a file can cost more CPU than encoding it, a link next to nothing.

    ('ok', (standard SHA-256, augmented SHA-256 or None, mode)) or ('rejected', reason). Writing
    in the workers spreads the cost of creating files over them."""
    status, payload = process_image(path, size, max_pixels, augment)
    if status != "ok":
        return status, payload
    standard, augmented, mode = payload
    std_path, orig_path, aug_path = targets
    write_file(std_path, standard)
    if augmented is not None:
        try:
            os.link(std_path, orig_path)
        except OSError:  # a filesystem without hard links
            write_file(orig_path, standard)
        write_file(aug_path, augmented)
    digest = hashlib.sha256(standard).digest()
    return "ok", (digest, augmented and hashlib.sha256(augmented).digest(), mode)


# --- source -> PetImages folder --------------------------------------------------------------


def synthetic_valid_count(per_class: int) -> int:
    # A few more valid images than needed, so the seeded choice is a choice.
    return per_class + max(10, per_class // 10)


# The second line of every failed download: each other way in, all three offline.
WITHOUT_DOWNLOAD = ("Without the download: --source FILE.zip (the archive, fetched some other way), "
                    "--source FOLDER (it extracted), or --source synthetic (a generated stand-in; "
                    "`catsdogs reproduce --config quick` runs the whole article on it).")


def source_kind(source: str) -> str:
    """'synthetic', 'url' (http or https) or 'path' (a .zip or an extracted folder)."""
    if source == "synthetic":
        return "synthetic"
    return "url" if re.match(r"^https?://", source) else "path"


def check_source(source: str) -> str:
    """A source prepare can read: 'synthetic', a URL, or a file or folder that exists."""
    if source_kind(source) == "path" and not Path(source).expanduser().exists():
        raise SettingError(f"no such file or folder: {source}", "source")
    return source


def resolve_source(params: PrepareParams, data_dir: Path, log, progress: bool) -> tuple[Path, dict]:
    """Return the PetImages folder and a description of where it came from."""
    src = params.source
    downloads = data_dir / "downloads"
    if source_kind(src) == "synthetic":
        from catsdogs.data.synthetic import make_synthetic_archive

        n_valid = synthetic_valid_count(params.per_class)
        archive = downloads / f"synthetic-{n_valid}.zip"
        if not archive.exists():
            downloads.mkdir(parents=True, exist_ok=True)
            log(f"Generating a synthetic PetImages archive ({n_valid} valid images per class) ...")
            make_synthetic_archive(archive, n_valid)
        pets, sha = extract_archive(archive, data_dir, None, log)
        return pets, {"kind": "synthetic", "n_valid": n_valid, "sha256": sha}
    if source_kind(src) == "url":
        from catsdogs.data.download import download

        name = PurePosixPath(src.split("?")[0]).name or "archive.zip"
        expected_size = config.ARCHIVE_SIZE if src == config.ARCHIVE_URL else None
        try:
            archive = download(src, downloads / name, sha256=params.sha256,
                               expected_size=expected_size, progress=progress, log=log)
        except ChecksumError:
            raise
        except DownloadError as e:
            e.hint = WITHOUT_DOWNLOAD
            raise
        pets, sha = extract_archive(archive, data_dir, params.sha256, log)
        return pets, {"kind": "url", "url": src, "sha256": sha}
    path = Path(src).expanduser()
    if path.is_dir():
        pets = path if (path / "Cat").is_dir() else path / "PetImages"
        check_layout(pets, f"--source {src}")
        return pets, {"kind": "folder", "path": str(path.resolve()), "sha256": None}
    pets, sha = extract_archive(path, data_dir, params.sha256, log)  # a file: prepare checked it exists
    return pets, {"kind": "zip", "path": str(path.resolve()), "sha256": sha}


def check_layout(pets: Path, what: str) -> None:
    missing = [c for c in config.CLASSES if not (pets / c).is_dir()]
    if missing:
        raise ArchiveError(f"{what} has no PetImages/{'/, PetImages/'.join(missing)}/ folder")


def safe_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """Every member, after making sure none can land outside the target folder."""
    members = zf.infolist()
    for m in members:
        name = m.filename.replace("\\", "/")
        parts = PurePosixPath(name).parts
        if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            raise ArchiveError(f"unsafe path in archive, refusing to extract: {m.filename!r}")
        if (m.external_attr >> 16) & 0o170000 == 0o120000:
            raise ArchiveError(f"symbolic link in archive, refusing to extract: {m.filename!r}")
    return members


def extract_archive(archive: Path, data_dir: Path, sha256: str | None, log) -> tuple[Path, str]:
    """Verify (when a hash is given), then extract to a temporary folder renamed when complete."""
    from catsdogs.data.download import sha256_of

    actual = sha256_of(archive)
    if sha256 and actual.lower() != sha256.lower():
        raise ArchiveError(
            f"{archive} has SHA-256 {actual}, expected {sha256} (pass the right --sha256, or --no-verify)"
        )
    final = data_dir / "extracted" / actual[:16]
    pets = final / "PetImages"
    if pets.is_dir():
        return pets, actual
    if not zipfile.is_zipfile(archive):
        raise ArchiveError(f"{archive} is not a zip archive")
    tmp = final.parent / f".tmp-{actual[:16]}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            members = safe_members(zf)
            log(f"Extracting {len(members):,} members of {archive.name} ...")
            zf.extractall(tmp, members)
        check_layout(tmp / "PetImages", str(archive))
        if final.exists():  # a half-finished older attempt without PetImages
            shutil.rmtree(final)
        os.replace(tmp, final)
    except zipfile.BadZipFile as e:
        raise ArchiveError(f"{archive} is not a readable zip archive: {e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return pets, actual


# --- select, split, write ---------------------------------------------------------------------


def numeric_order(name: str) -> tuple:
    stem = name.rsplit(".", 1)[0]
    return (0, int(stem), name) if stem.isdigit() else (1, 0, name)


def seeded_order(names: list[str], seed: int, class_index: int) -> list[str]:
    """listdir's order is arbitrary; sort, then shuffle with a recorded seed."""
    names = sorted(names, key=numeric_order)
    rng = np.random.default_rng([seed, class_index])
    return [names[i] for i in rng.permutation(len(names))]


def split_of(i: int, split: tuple[int, int, int]) -> str:
    if i < split[0]:
        return "train"
    return "validation" if i < split[0] + split[1] else "test"


def folder_fingerprint(root: Path, dirs: list[str]) -> str:
    """SHA-256 over every prepared file's relative path and bytes: names the data of a trial."""
    h = hashlib.sha256()
    for d in dirs:
        for p in sorted((root / d).rglob("*.jpg")):
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@contextlib.contextmanager
def prepare_lock(data_dir: Path):
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".prepare.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CatsdogsError(f"another `catsdogs prepare` is running on {data_dir}") from None
        yield


def select_and_write(pets: Path, params: PrepareParams, staging: Path, log, progress: bool) -> dict:
    """Decode candidates in seeded order until `per_class` are valid; write both data sets.

    Also returns the SHA-256 of every file written (by path relative to `staging`), so the
    fingerprints need not read the files back."""
    chosen: dict = {c: {s: [] for s in config.SPLIT_NAMES} for c in config.CLASSES}
    rejected: list[dict] = []
    checked: dict = {}
    modes: Counter = Counter()
    digests: dict[str, bytes] = {}  # by path relative to staging, '/'-separated
    pending = staging / ".pending"  # where the workers write; removed with the staging folder
    for c in config.CLASSES:
        (pending / c).mkdir(parents=True)
        for s in config.SPLIT_NAMES:
            (staging / "standard" / s / c).mkdir(parents=True)
            if s != "test":
                (staging / "augmented" / s / c).mkdir(parents=True)

    root = str(staging)  # plain strings here: pathlib would cost the main process a tenth of its CPU

    def final_paths(c: str, s: str, name: str) -> tuple[str, str, str]:
        return (f"standard/{s}/{c}/{name}", f"augmented/{s}/{c}/{name}",
                f"augmented/{s}/{c}/augmented_{name}")

    n_augmented = params.split[0] + params.split[1]  # the first this many valid go to train/validation
    # Forking is nearly free and spares each worker re-importing numpy and Pillow (a tenth of
    # the CPU of a 2,000-image prepare); but a process that has started TensorFlow's threads
    # must not be forked, so then the workers are spawned.
    ctx = get_context("spawn" if "tensorflow" in sys.modules else "fork")
    bar = _Progress(progress, total=params.per_class * len(config.CLASSES), what="images")
    with ProcessPoolExecutor(WORKERS, mp_context=ctx, initializer=_worker_init,
                             initargs=(os.getpid(),)) as pool, bar:
        for ci, c in enumerate(config.CLASSES):
            names = sorted(os.listdir(pets / c), key=numeric_order)
            for n in names:
                if not n.endswith(".jpg"):  # the article's filter; Thumbs.db lands here
                    rejected.append({"file": f"{c}/{n}", "reason": "not a .jpg file"})
            order = seeded_order([n for n in names if n.endswith(".jpg")], params.seed, ci)
            counted = {"valid": 0}  # read when a candidate is submitted, a window ahead

            def args_of(name, ahead, c=c, counted=counted):
                # With `ahead` candidates still in flight before this one, its index among the
                # valid images, if it is valid, lies in valid .. valid + ahead. When that range
                # is inside one split, the worker writes straight into the split's folders (the
                # usual case: rejections are rare); otherwise into `pending`, and the files are
                # renamed into place once the split is known.
                lo, hi = counted["valid"], counted["valid"] + ahead
                # A candidate submitted once `n_augmented` are already valid can only be a
                # test image (or not chosen at all): skip its augmented copy. Before that,
                # the decodes still in flight may be rejected, so make it to be safe.
                augment = lo < n_augmented
                first = split_of(lo, params.split)
                if hi < params.per_class and first == split_of(hi, params.split):
                    targets = tuple(f"{root}/{rel}" for rel in final_paths(c, first, name))
                else:
                    targets = tuple(f"{pending}/{c}/{name}{x}" for x in (".std.jpg", ".orig.jpg", ".aug.jpg"))
                return (f"{pets}/{c}/{name}", params.size, config.MAX_IMAGE_PIXELS, augment, targets)

            def batch(in_flight, counted=counted):
                # Big batches while many images are still needed, single ones near the end,
                # so that what is decoded after the last valid image stays little.
                wanted = params.per_class - counted["valid"] - in_flight
                return max(1, min(BATCH, wanted // (2 * WORKERS)))

            n_checked = 0
            results = in_order(pool, order, args_of, window=WINDOW, batch=batch)
            for name, args, (status, payload) in results:
                n_checked += 1
                if status != "ok":
                    rejected.append({"file": f"{c}/{name}", "reason": payload})
                    continue
                standard, augmented, mode = payload  # their SHA-256s: the files are written
                modes[mode] += 1
                s = split_of(counted["valid"], params.split)
                chosen[c][s].append(name)
                if s != "test" and augmented is None:  # cannot happen: see args_of
                    raise RuntimeError(f"no augmented copy made for {c}/{name} ({s})")
                *_, targets = args  # where the worker wrote them
                files = zip(targets, final_paths(c, s, name), (standard, standard, augmented), strict=True)
                for written, rel, digest in itertools.islice(files, 1 if s == "test" else 3):
                    if written != f"{root}/{rel}":  # in `pending`: its split was not yet known
                        if not written.startswith(f"{pending}/"):  # cannot happen: see args_of
                            raise RuntimeError(f"{c}/{name} was written to the wrong split")
                        os.rename(written, f"{root}/{rel}")
                    digests[rel] = digest
                bar.advance()
                counted["valid"] += 1
                if counted["valid"] == params.per_class:
                    break
            results.close()  # cancels the decodes still in flight
            checked[c] = n_checked
            if counted["valid"] < params.per_class:
                raise CatsdogsError(
                    f"only {counted['valid']} valid images in {c} (of {len(order)} .jpg files); "
                    f"--per-class {params.per_class} needs more"
                )
    return {"chosen": chosen, "rejected": rejected, "checked": checked, "modes": dict(modes),
            "digests": digests}


def fingerprint_of(digests: dict[str, bytes], dirs: list[str]) -> str:
    """folder_fingerprint() of the files whose SHA-256 digests we already have (same order:
    paths sort part by part, as pathlib sorts them)."""
    h = hashlib.sha256()
    for d in dirs:
        inside = (r for r in digests if r.startswith(d + "/") and r.endswith(".jpg"))
        for rel in sorted(inside, key=lambda r: r.split("/")):
            h.update(rel.encode() + b"\0")
            h.update(digests[rel])
    return h.hexdigest()


def in_order(pool, items, args_of, window: int = WINDOW, batch=lambda in_flight: 1):
    """Yield (item, args, process_and_write(*args)) in the items' order, a bounded window ahead,
    where args = args_of(item, number of items in flight before it).

    In order, so the choice is the same whatever the timing; bounded, so stopping early
    after `per_class` valid images wastes little: at most `window` items are in flight, and
    those not yet handed to a worker are cancelled. Items travel in batches of
    `batch(in_flight)`, which saves a round trip between processes per item."""
    pending: deque = deque()  # (items, their args, future of their results)
    in_flight = 0
    rest = iter(items)
    try:
        while True:
            while in_flight < window:
                n = max(1, min(batch(in_flight), window - in_flight))
                chunk = list(itertools.islice(rest, n))
                if not chunk:
                    break
                args = [args_of(x, in_flight + k) for k, x in enumerate(chunk)]
                pending.append((chunk, args, pool.submit(process_batch, args)))
                in_flight += len(chunk)
            if not pending:
                return
            chunk, args, fut = pending.popleft()
            in_flight -= len(chunk)
            yield from zip(chunk, args, fut.result(), strict=True)
    finally:
        for _, _, fut in pending:
            fut.cancel()


def process_batch(tasks: list[tuple]) -> list[tuple[str, object]]:
    return [process_and_write(*args) for args in tasks]


def _worker_init(parent: int) -> None:
    """Make each worker exit soon after the main process dies, even by kill -9: otherwise
    it would wait for work forever, an orphan."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="catsdogs-parent-watch", daemon=True).start()


class _Progress:
    """A rich bar on a terminal, nothing otherwise (tests, logs)."""

    def __init__(self, enabled: bool, total: int, what: str):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                                MofNCompleteColumn(), TimeRemainingColumn(), transient=True)
            self.task = self.bar.add_task(f"Preparing {what}", total=total)

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def advance(self):
        if self.bar:
            self.bar.advance(self.task)


# --- the command -----------------------------------------------------------------------------


def prepare(source: str = config.ARCHIVE_URL, data_dir: Path | str | None = None,
            sha256: str | None = config.ARCHIVE_SHA256, per_class: int = config.PER_CLASS,
            split: tuple[int, int, int] = config.SPLIT, size: int = config.IMAGE_SIZE,
            seed: int = config.SEED, log=print, progress: bool = True) -> dict:
    """Build (or find already built) the article's folders under `data_dir`; return the manifest."""
    data_dir = Path(data_dir) if data_dir is not None else config.default_data_dir()
    split = tuple(split)  # type: ignore[assignment]
    check_prepare(per_class, split, size)
    check_source(source)
    if source == "synthetic":
        sha256 = None  # we make it ourselves; its hash is recorded, not checked
    elif sha256 is not None:
        sha256 = check_sha256(sha256)
    params = PrepareParams(source, sha256, per_class, split, size, seed)  # type: ignore[arg-type]

    existing = load_manifest(data_dir)
    if existing and existing["params"] == params.key():
        log(f"Already prepared in {data_dir} with these parameters: nothing to do.")
        return existing

    with prepare_lock(data_dir):
        # Left by a killed prepare (the lock says none runs now): half-built folders, half
        # an extraction (up to the archive's size each time), a half-written manifest.
        for stale in [*data_dir.glob(".staging-*"), *data_dir.glob("extracted/.tmp-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        for stale in data_dir.glob(f".{MANIFEST}.*.tmp"):
            stale.unlink(missing_ok=True)
        started = time.time()
        pets, origin = resolve_source(params, data_dir, log, progress)
        staging = data_dir / f".staging-{uuid.uuid4().hex[:8]}"
        try:
            picked = select_and_write(pets, params, staging, log, progress)
            counts = count_files(staging)
            manifest = {
                "format": FORMAT,
                "complete": True,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.time() - started, 2),
                "params": params.key(),
                "source": {**origin, "verified": params.sha256 is not None},
                "pixels": {"resize": "nearest (keras load_img)", "save": "keras save_img: min-max "
                           "stretch, JPEG quality 75", "augment": "resize to 1.25x size "
                           "(Pillow default filter), crop top-left size x size"},
                "labels": {c: i for i, c in enumerate(config.CLASSES)},
                "counts": counts,
                "checked": picked["checked"],
                "source_modes": picked["modes"],
                "rejected": picked["rejected"],
                "chosen": picked["chosen"],
                "fingerprint": {
                    "standard": fingerprint_of(picked["digests"], ["standard"]),
                    "augmented": fingerprint_of(picked["digests"], ["augmented", "standard/test"]),
                },
                "versions": versions(),
            }
            _commit(staging, data_dir, manifest)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    log(summary_line(manifest))
    return manifest


def _commit(staging: Path, data_dir: Path, manifest: dict) -> None:
    """Swap the new folders in. The manifest goes first and comes back last, so a kill at
    any point leaves no manifest next to half-replaced folders, and nothing counts as finished."""
    with contextlib.suppress(FileNotFoundError):
        (data_dir / MANIFEST).unlink()
    for name in ("standard", "augmented"):
        old = data_dir / name
        if old.exists():
            trash = data_dir / f".staging-old-{uuid.uuid4().hex[:8]}"
            os.replace(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging / name, old)
    write_json_atomic(data_dir / MANIFEST, manifest, fsync=True)


def summary_line(manifest: dict) -> str:
    reasons = Counter(r["reason"].split(":")[0].split(" (")[0] for r in manifest["rejected"])
    why = ", ".join(f"{k}: {v}" for k, v in reasons.most_common())
    n_chosen = sum(len(v) for c in manifest["chosen"].values() for v in c.values())
    n_checked = sum(manifest["checked"].values())
    return (f"Prepared {n_chosen:,} images ({manifest['params']['size']} px) from "
            f"{n_checked:,} decoded; rejected {len(manifest['rejected']):,} ({why or 'none'}) "
            f"in {manifest['seconds']} s.")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `catsdogs prepare`")
