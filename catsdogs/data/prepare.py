"""From the source archive to the article's folders: download, extract, validate, split, resize.

    source (URL | .zip | PetImages folder | "synthetic")
      -> archive in data/downloads/  (verified SHA-256)
      -> data/extracted/<sha>/PetImages  (safe, atomic extraction)
      -> per class, a seeded order of the .jpg names, each fully decoded; the first
         `per_class` that decode are chosen and split train / validation / test
      -> data/standard/{train,validation,test}/{Cat,Dog}/, data/augmented/{train,validation}/...
      -> data/manifest.json, written last: it is the mark of a finished prepare.

The source is catsdogs.data.source's to fetch and open; the pixels are catsdogs.data.images'
(the article's resize, save and augmented copy, made in decode processes); this module chooses,
splits and writes, and writes the manifest (catsdogs.manifest).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import sys
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from catsdogs import config
from catsdogs.data.images import process_and_write
from catsdogs.data.repair import record_file_digests, repair
from catsdogs.data.source import check_source, resolve_source
from catsdogs.errors import CatsdogsError
from catsdogs.files import write_json_atomic
from catsdogs.host import process_alive, versions
from catsdogs.manifest import (
    FINGERPRINT_DIRS,
    FORMAT,
    MANIFEST,
    PrepareParams,
    changed_files,
    count_files,
    fingerprint_of,
    load_manifest,
)
from catsdogs.schema import check_prepare, check_sha256

WORKERS = os.cpu_count() or 1  # one decode process per core: decoding is the cost
BATCH = 8  # candidates per task sent to a worker, at most (fewer round trips)
WINDOW = WORKERS * 16  # candidates in flight, at most (what an early stop may waste)


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


@contextlib.contextmanager
def prepare_lock(data_dir: Path):
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".prepare.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CatsdogsError(f"another `catsdogs prepare` is running on {data_dir}") from None
        yield


def _remove_leftovers(data_dir: Path) -> None:
    """What a killed prepare left (the lock says none runs now): half-built folders, half an
    extraction (up to the archive's size each time), a half-written manifest."""
    for stale in [*data_dir.glob(".staging-*"), *data_dir.glob("extracted/.tmp-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in data_dir.glob(f".{MANIFEST}.*.tmp"):
        stale.unlink(missing_ok=True)


def select_and_write(pets: Path, params: PrepareParams, staging: Path, log, progress: bool) -> dict:
    """Decode candidates in seeded order until `per_class` are valid; write both data sets.

    Also returns the SHA-256 of every file written (by path relative to `staging`), so the
    fingerprints need not read the files back."""
    picked = {"chosen": {c: {s: [] for s in config.SPLIT_NAMES} for c in config.CLASSES}, "rejected": [],
              "checked": {}, "modes": Counter(), "digests": {}}
    pending = staging / ".pending"  # where the workers write; removed with the staging folder
    for c in config.CLASSES:
        (pending / c).mkdir(parents=True)
        for s in config.SPLIT_NAMES:
            (staging / "standard" / s / c).mkdir(parents=True)
            if s != "test":
                (staging / "augmented" / s / c).mkdir(parents=True)
    ctx = _decode_context()
    bar = _Progress(progress, total=params.per_class * len(config.CLASSES), what="images")
    with ProcessPoolExecutor(WORKERS, mp_context=ctx, initializer=_worker_init,
                             initargs=(os.getpid(),)) as pool, bar:
        for ci, c in enumerate(config.CLASSES):
            # plain strings: pathlib would cost the main process a tenth of its CPU
            _select_class(pool, pets, ci, _Selection(c, params, str(pets), str(staging), str(pending), picked), bar)
    return {**picked, "modes": dict(picked["modes"])}


def _select_class(pool, pets: Path, ci: int, sel: _Selection, bar: _Progress) -> None:
    """One class: its .jpg candidates decoded in their seeded order, a window ahead, until
    `per_class` are valid (the decodes still in flight then cancelled)."""
    c, params = sel.c, sel.params
    names = sorted(os.listdir(pets / c), key=numeric_order)
    for n in names:
        if not n.endswith(".jpg"):  # the article's filter; Thumbs.db lands here
            sel.picked["rejected"].append({"file": f"{c}/{n}", "reason": "not a .jpg file"})
    order = seeded_order([n for n in names if n.endswith(".jpg")], params.seed, ci)
    n_checked = 0
    results = in_order(pool, order, sel.args_of, window=WINDOW, batch=sel.batch)
    for name, args, (status, payload) in results:
        n_checked += 1
        if sel.take(name, args, status, payload):
            bar.advance()
            if sel.valid == params.per_class:
                break
    results.close()  # cancels the decodes still in flight
    sel.picked["checked"][c] = n_checked
    if sel.valid < params.per_class:
        raise CatsdogsError(f"only {sel.valid} valid images in {c} (of {len(order)} .jpg files); "
                            f"--per-class {params.per_class} needs more")


class _Selection:
    """One class's choice as it goes: where each candidate's decode writes its files
    (`args_of`), how many go to a decode process at once (`batch`), and what each answer does
    (`take`: a rejection noted, a valid image moved into its split and its digests kept)."""

    def __init__(self, c: str, params: PrepareParams, pets: str, root: str, pending: str, picked: dict):
        self.c, self.params, self.pets, self.root, self.pending, self.picked = c, params, pets, root, pending, picked
        self.valid = 0  # valid images so far: read when a candidate is submitted, a window ahead
        self.n_augmented = params.split[0] + params.split[1]  # the first this many valid go to train/validation

    def final_paths(self, s: str, name: str) -> tuple[str, str, str]:
        c = self.c
        return (f"standard/{s}/{c}/{name}", f"augmented/{s}/{c}/{name}", f"augmented/{s}/{c}/augmented_{name}")

    def args_of(self, name: str, ahead: int) -> tuple:
        # With `ahead` candidates still in flight before this one, its index among the valid
        # images, if it is valid, lies in valid .. valid + ahead. When that range is inside one
        # split, the worker writes straight into the split's folders (the usual case: rejections
        # are rare); otherwise into `pending`, and the files are renamed into place once the
        # split is known.
        params, c = self.params, self.c
        lo, hi = self.valid, self.valid + ahead
        # A candidate submitted once `n_augmented` are already valid can only be a test image (or
        # not chosen at all): skip its augmented copy. Before that, the decodes still in flight
        # may be rejected, so make it to be safe.
        augment = lo < self.n_augmented
        first = split_of(lo, params.split)
        if hi < params.per_class and first == split_of(hi, params.split):
            targets = tuple(f"{self.root}/{rel}" for rel in self.final_paths(first, name))
        else:
            targets = tuple(f"{self.pending}/{c}/{name}{x}" for x in (".std.jpg", ".orig.jpg", ".aug.jpg"))
        return (f"{self.pets}/{c}/{name}", params.size, config.MAX_IMAGE_PIXELS, augment, targets)

    def batch(self, in_flight: int) -> int:
        # Big batches while many images are still needed, single ones near the end, so that
        # what is decoded after the last valid image stays little.
        wanted = self.params.per_class - self.valid - in_flight
        return max(1, min(BATCH, wanted // (2 * WORKERS)))

    def take(self, name: str, args: tuple, status: str, payload) -> bool:
        """One candidate's answer; True when it was valid (and is now in its split)."""
        c, picked = self.c, self.picked
        if status != "ok":
            picked["rejected"].append({"file": f"{c}/{name}", "reason": payload})
            return False
        standard, augmented, mode = payload  # their SHA-256s: the files are written
        picked["modes"][mode] += 1
        s = split_of(self.valid, self.params.split)
        picked["chosen"][c][s].append(name)
        if s != "test" and augmented is None:  # cannot happen: see args_of
            raise RuntimeError(f"no augmented copy made for {c}/{name} ({s})")
        *_, targets = args  # where the worker wrote them
        files = zip(targets, self.final_paths(s, name), (standard, standard, augmented), strict=True)
        for written, rel, digest in itertools.islice(files, 1 if s == "test" else 3):
            if written != f"{self.root}/{rel}":  # in `pending`: its split was not yet known
                if not written.startswith(f"{self.pending}/"):  # cannot happen: see args_of
                    raise RuntimeError(f"{c}/{name} was written to the wrong split")
                os.rename(written, f"{self.root}/{rel}")
            picked["digests"][rel] = digest
        self.valid += 1
        return True


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


FRAMEWORKS_WITH_THREADS = ("tensorflow", "jax")  # started, they run threads of their own


def _decode_context():
    """How the decode processes are made. Forking is nearly free and spares each one importing
    numpy and Pillow (a tenth of the CPU of a 2,000-image prepare); but a process whose framework
    runs threads (the Python API's, a test's) must not be forked. There they are forked from a
    fork server instead: a fresh process, started once for every prepare of this one, that has
    imported this module and nothing of a framework (spawned instead, each decode process would
    import numpy and Pillow anew)."""
    if not any(name in sys.modules for name in FRAMEWORKS_WITH_THREADS):
        return get_context("fork")
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # (where the server already runs, as it was started)
    return ctx


def _worker_init(main: int) -> None:
    """Make each worker exit soon after the main process dies, even by kill -9: otherwise
    it would wait for work forever, an orphan. Its parent then changes (the main process where
    it was forked from it, else the fork server, which ends with the main process), or the main
    process is gone (where it died before this ran)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent and process_alive(main):
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
            seed: int = config.SEED, log=print, progress: bool = True, force: bool = False) -> dict:
    """Build (or find already built) the article's folders under `data_dir`; return the manifest.

    Folders already prepared with these parameters are checked file by file against the
    manifest: files changed since are rebuilt from the source (catsdogs.data.repair), the rest kept. `force`
    rebuilds everything."""
    data_dir = Path(data_dir) if data_dir is not None else config.default_data_dir()
    split = tuple(split)  # type: ignore[assignment]
    check_prepare(per_class, split, size, seed)
    check_source(source)
    if source == "synthetic":
        sha256 = None  # we make it ourselves; its hash is recorded, not checked
    elif sha256 is not None:
        sha256 = check_sha256(sha256)
    params = PrepareParams(source, sha256, per_class, split, size, seed)  # type: ignore[arg-type]

    existing = load_manifest(data_dir)
    if existing and existing["params"] == params.key() and not force:
        changed = changed_files(data_dir, existing)
        if not changed:
            with contextlib.suppress(CatsdogsError, OSError), prepare_lock(data_dir):  # none running (and writable): tidy
                _remove_leftovers(data_dir)
                record_file_digests(data_dir, existing)
            log(f"Already prepared in {data_dir} with these parameters, every file as written: nothing to do.")
            return existing
        log(f"{len(changed)} prepared file(s) changed since they were written (first: {changed[0]}): rebuilding them.")
        with prepare_lock(data_dir):
            _remove_leftovers(data_dir)
            if repair(existing, changed, params, data_dir, log, progress):
                log(f"Rebuilt {len(changed)} file(s) in {data_dir}; every file is again as the manifest records it.")
                return existing
        log("They cannot be rebuilt one by one (the source or the image library changed): preparing everything again.")

    with prepare_lock(data_dir):
        _remove_leftovers(data_dir)
        started = time.time()
        pets, origin = resolve_source(params.source, params.sha256, params.per_class, data_dir, log, progress)
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
                "fingerprint": {name: fingerprint_of(picked["digests"], dirs)
                                for name, dirs in FINGERPRINT_DIRS.items()},
                # each file's SHA-256: what prepare and every sweep check the folders against
                "files": {rel: picked["digests"][rel].hex() for rel in sorted(picked["digests"])},
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
