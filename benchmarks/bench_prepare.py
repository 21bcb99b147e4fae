"""Time `prepare` against a plain sequential load-resize-save loop written like the article's.

Both sides start from the same extracted PetImages folder (a synthetic one by default, made
once beforehand) and write the same output: the article's standard and augmented folders for
the same chosen files, so only the load / resize / save work is compared. The loop is the
article's, on the file list prepare chose::

    for each class, for each chosen file (train, then validation, then test):
        photo = keras.utils.load_img(path, target_size=(size, size))
        keras.utils.save_img(standard/<split>/<class>/<name>, photo)
        if split != test:
            keras.utils.save_img(augmented/<split>/<class>/<name>, photo)
            keras.utils.save_img(augmented/<split>/<class>/augmented_<name>,
                                 photo.resize((1.25 size, 1.25 size)).crop((0, 0, size, size)))

prepare's time is the whole `prepare()` call (its worker pool, validation of every candidate
it decodes, the manifest and fingerprints included). The sides alternate, each repeated
`--repeats` times; the medians are reported. After the runs, the two output trees are
compared byte for byte.

    python benchmarks/bench_prepare.py                      # the article's parameters
    python benchmarks/bench_prepare.py --n-valid 330 --per-class 300 --split 180,60,60 --repeats 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from harness import alternate, cpu_seconds, median_of, spread, table

from catsdogs import config
from catsdogs.data.prepare import WORKERS, prepare
from catsdogs.data.synthetic import make_synthetic_archive
from catsdogs.schema import parse_split


def make_source(workdir: Path, n_valid: int) -> Path:
    """A synthetic archive with `n_valid` valid images per class, extracted once (cached)."""
    pets = workdir / f"source-{n_valid}" / "PetImages"
    if pets.is_dir():
        return pets
    archive = workdir / f"synthetic-{n_valid}.zip"
    print(f"Generating a synthetic archive ({n_valid} valid images per class) ...", flush=True)
    make_synthetic_archive(archive, n_valid)
    tmp = workdir / f".source-{n_valid}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp)
    os.replace(tmp, pets.parent)
    return pets


def run_prepare(pets: Path, out: Path, args) -> tuple[float, float, dict, str]:
    """prepare()'s wall time, CPU time (its own and its pool workers'), manifest, CPU split."""
    c0, w0, t0 = cpu_seconds(), cpu_seconds(resource.RUSAGE_CHILDREN), time.perf_counter()
    manifest = prepare(source=str(pets), data_dir=out, sha256=None, per_class=args.per_class,
                       split=args.split, size=args.size, seed=args.seed, log=lambda *_: None,
                       progress=False)
    seconds = time.perf_counter() - t0
    main, workers = cpu_seconds() - c0, cpu_seconds(resource.RUSAGE_CHILDREN) - w0  # workers: reaped
    return seconds, main + workers, manifest, f"; main {main:.2f} s + workers {workers:.2f} s"


def run_article_loop(pets: Path, out: Path, chosen: dict, size: int) -> tuple[float, float]:
    """The article's sequential loop over the files prepare chose, in the same order."""
    from keras.utils import load_img, save_img  # imported before timing, not in prepare's workers

    big = int(size * config.AUGMENT_SCALE)
    for c in config.CLASSES:  # the folders first, as the article's code does
        for s in config.SPLIT_NAMES:
            (out / "standard" / s / c).mkdir(parents=True)
            if s != "test":
                (out / "augmented" / s / c).mkdir(parents=True)
    c0, t0 = cpu_seconds(), time.perf_counter()  # the loop runs in this process alone
    for c in config.CLASSES:
        for s in config.SPLIT_NAMES:
            for name in chosen[c][s]:
                photo = load_img(pets / c / name, target_size=(size, size))
                save_img(out / "standard" / s / c / name, photo)
                if s != "test":
                    save_img(out / "augmented" / s / c / name, photo)
                    augmented = photo.resize((big, big)).crop((0, 0, size, size))
                    save_img(out / "augmented" / s / c / f"augmented_{name}", augmented)
    return time.perf_counter() - t0, cpu_seconds() - c0


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in ("standard", "augmented") for p in sorted((root / d).rglob("*.jpg"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-valid", type=int, default=1100, help="valid synthetic images per class")
    ap.add_argument("--source", type=Path, help="an extracted PetImages folder instead of synthetic")
    ap.add_argument("--per-class", type=int, default=config.PER_CLASS)
    ap.add_argument("--split", type=parse_split, default=config.SPLIT)
    ap.add_argument("--size", type=int, default=config.IMAGE_SIZE)
    ap.add_argument("--seed", type=int, default=config.SEED)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, help="where sources and outputs go (default: a temp dir)")
    args = ap.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pets = args.source or make_source(workdir, args.n_valid)
    import keras  # noqa: F401  (the loop's import, paid once, before any timing)

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n_images = args.per_class * len(config.CLASSES)
    print(f"cores: {os.cpu_count()} (usable {affinity}); prepare workers: {WORKERS}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"source: {pets}; per class {args.per_class}, split {','.join(map(str, args.split))}, "
          f"size {args.size}: {n_images} images per run")

    outputs = workdir / f"outputs-{os.getpid()}"
    state: dict = {"chosen": None, "last": {}}

    def side(name: str):
        def one(r: int) -> dict:
            # A fresh folder per run, all deleted at the end: on ext4, creating files soon
            # after deleting thousands is markedly slower (it skips recently freed inodes),
            # which would tax whichever side ran after a clean-up.
            out = outputs / f"{name.replace(' ', '-')}-{r + 1}"
            if name == "prepare":
                seconds, cpu_s, manifest, detail = run_prepare(pets, out, args)
                state["chosen"] = manifest["chosen"]
            else:  # after prepare in every round (A B A B): the loop needs prepare's choice
                seconds, cpu_s = run_article_loop(pets, out, state["chosen"], args.size)
                detail = ""
            state["last"][name] = out
            print(f"  run {r + 1}: {name:12s} {seconds:7.2f} s  {n_images / seconds:7.1f} images/s"
                  f"  (CPU {cpu_s:6.2f} s, {1000 * cpu_s / n_images:.2f} ms per image{detail}; "
                  f"load {os.getloadavg()[0]:.1f})", flush=True)
            return {"seconds": seconds, "cpu": cpu_s}
        return one

    runs = alternate({name: side(name) for name in ("prepare", "article loop")}, args.repeats, log=lambda line: None)
    same = tree_digest(state["last"]["prepare"]) == tree_digest(state["last"]["article loop"])
    shutil.rmtree(outputs, ignore_errors=True)
    rate = {name: n_images / median_of(rs, "seconds") for name, rs in runs.items()}
    best = {name: n_images / spread(r["seconds"] for r in rs)[1] for name, rs in runs.items()}
    ms = {name: 1000 * median_of(rs, "cpu") / n_images for name, rs in runs.items()}
    ratio = rate["prepare"] / rate["article loop"]
    print(table(("side", "images/s (median)", "best", f"CPU ms per image (medians of {args.repeats})"),
                [(name, f"{rate[name]:.1f}", f"{best[name]:.1f}", f"{ms[name]:.2f}") for name in runs]))
    print(f"ratio: {ratio:.2f}x on {affinity} cores (of the best runs: "
          f"{best['prepare'] / best['article loop']:.2f}x); outputs byte-identical: {same}")
    # Wall-clock ratios need idle cores (other work on the machine shows in the load average
    # printed with each run); CPU per image does not. With the cores to itself, prepare can
    # reach about (cores x loop CPU / prepare CPU), its workers running in parallel.
    print(f"CPU per image, loop / prepare: {ms['article loop'] / ms['prepare']:.2f} "
          f"(so at most ~{affinity * ms['article loop'] / ms['prepare']:.1f}x on {affinity} idle cores)")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":  # the guard matters: prepare's spawned workers re-import this file
    sys.exit(main())
