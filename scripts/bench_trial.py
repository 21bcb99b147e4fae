"""Benchmark one trial of the case study: our Keras 3 / tf.data path against the article's way.

The article (Keras 2) read every batch from disk with
``ImageDataGenerator(rescale=1/255).flow_from_directory(..., class_mode='binary',
target_size=(200, 200))`` and trained with ``model.fit(train_it, steps_per_epoch=n // bs, ...)``.
catsdogs decodes each image once into uint8 memory and serves batches with tf.data
(catsdogs.data), and trains with Keras 3 (catsdogs.trial.run_trial). This script measures, on
the same prepared folder and this machine:

(a) the input pipeline alone, the training folder, ``n // bs`` batches per epoch for the
    trial's epochs, each batch materialised as a numpy array: images/s per epoch (steady state)
    and over the whole trial's input work (ours including its one-time decode);
(b) one whole trial of the article's protocol (epochs, ``n // bs`` steps, validation on the
    real validation set, evaluation on the test set), float32, same batch size: ours
    (run_trial) against the same trial written the article's way on tf_keras;
(c) the FLOP/s our trial achieves while training, against this machine's float32 matmul peak
    measured in the same run.

Every measurement runs in its own child process (``--side ...``), so no TensorFlow state
carries from one to the next; the two sides alternate within each repeat, and the table reports
medians. Import time is excluded from the trial and pipeline figures (each child starts its
clock after importing TensorFlow and the Keras it uses); the process wall time, imports
included, is shown as well.

    python scripts/bench_trial.py --data-dir /tmp/bdata              # the full run
    python scripts/bench_trial.py --data-dir /tmp/bdata --quick      # a shorter one
    python scripts/bench_trial.py --data-dir /tmp/bdata --variants jit,nodet   # what-ifs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

PREFIX = "@@bench "
SIZE = 200
SIDES = ("pipe-ours", "pipe-article", "trial-ours", "trial-article", "matmul")

# What-if changes to our trial, applied by monkeypatching in the child (catsdogs is not edited).
VARIANTS = {
    "jit": "model.compile(..., jit_compile=True) (XLA); Keras 3's 'auto' means False on CPU",
    "nodet": "no tf.config.experimental.enable_op_determinism()",
    "f32in": "the pipeline hands float32 pixels in 0..1 to a model without Rescaling",
    "nodet+jit": "both nodet and jit",
}


# --- children: one measurement each, printed as one JSON line -----------------------------


def emit(obj: dict) -> None:
    print(PREFIX + json.dumps(obj), flush=True)


def set_threads(threads: int) -> None:
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def thread_info() -> dict:
    import tensorflow as tf

    return {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter": tf.config.threading.get_inter_op_parallelism_threads()}


def child_pipe_ours(args) -> dict:
    import tensorflow as tf  # noqa: F401 - imported before the clock starts

    from catsdogs import data

    set_threads(args.threads)
    t0 = time.perf_counter()
    train = data.load_split(Path(args.data_dir) / "standard" / "train")
    decode = time.perf_counter() - t0
    steps = len(train) // args.batch_size
    ds = data.train_batches(train, args.batch_size, seed=0)
    epochs, touched = [], 0
    for _ in range(args.epochs):
        t = time.perf_counter()
        n = 0
        for x, y in ds:  # one epoch: exactly n // bs full batches
            xa, ya = x.numpy(), y.numpy()
            touched += int(xa[-1, -1, -1, -1]) + int(ya[-1])  # read from the materialised arrays
            n += 1
        epochs.append(time.perf_counter() - t)
        assert n == steps, (n, steps)
    return {"decode_s": decode, "epoch_s": epochs, "steps": steps, "n": len(train),
            "dtype": str(xa.dtype), "threads": thread_info()}


def _article_iterator(folder: Path, batch_size: int, shuffle: bool = True):
    from tf_keras.preprocessing.image import ImageDataGenerator

    gen = ImageDataGenerator(rescale=1.0 / 255)
    return gen.flow_from_directory(str(folder), class_mode="binary", batch_size=batch_size,
                                   target_size=(SIZE, SIZE), shuffle=shuffle, seed=0)


def child_pipe_article(args) -> dict:
    import tensorflow as tf  # noqa: F401
    import tf_keras  # noqa: F401

    set_threads(args.threads)
    t0 = time.perf_counter()
    it = _article_iterator(Path(args.data_dir) / "standard" / "train", args.batch_size)
    setup = time.perf_counter() - t0
    steps = it.n // args.batch_size
    epochs, touched = [], 0
    for _ in range(args.epochs):
        t = time.perf_counter()
        for i in range(steps):  # the full batches of this epoch's shuffle, as fit would see them
            x, y = it[i]
            touched += int(x[-1, -1, -1, -1]) + int(y[-1])
        it.on_epoch_end()  # reshuffle, as Keras does between epochs
        epochs.append(time.perf_counter() - t)
    return {"setup_s": setup, "epoch_s": epochs, "steps": steps, "n": it.n,
            "dtype": str(x.dtype), "threads": thread_info()}


def _apply_variant(variant: str) -> None:
    """Monkeypatch catsdogs / Keras for a what-if run of our trial."""
    import keras
    import tensorflow as tf

    parts = set(variant.split("+")) if variant else set()
    if "nodet" in parts:
        tf.config.experimental.enable_op_determinism = lambda: None
    if "jit" in parts:
        original = keras.Model.compile

        def compile_jit(self, *a, **kw):
            kw["jit_compile"] = True
            return original(self, *a, **kw)

        keras.Model.compile = compile_jit
    if "f32in" in parts:
        import numpy as np
        from keras import layers

        from catsdogs import data, model

        load = data.load_split

        def load_float(folder):
            split = load(folder)
            split.images = split.images.astype(np.float32) / np.float32(255)
            return split

        data.load_split = load_float

        def build_float(size: int = SIZE):
            return keras.Sequential([
                keras.Input((size, size, 3)),
                layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"),
                layers.MaxPooling2D((2, 2)),
                layers.Flatten(),
                layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
                layers.Dense(1, activation="sigmoid"),
            ])

        model.build_model = build_float


def child_trial_ours(args) -> dict:
    import keras  # noqa: F401
    import tensorflow as tf  # noqa: F401

    from catsdogs.trial import TrialConfig, run_trial

    set_threads(args.threads)
    _apply_variant(args.variant)
    cfg = TrialConfig(optimizer=args.optimizer, batch_size=args.batch_size, dataset="standard",
                      seed=0, epochs=args.epochs, image_size=SIZE)
    t0 = time.perf_counter()
    rec = run_trial(cfg, Path(args.data_dir))
    work = time.perf_counter() - t0
    return {"work_s": work, "train_s": rec["train_seconds"], "fit_s": rec["fit_seconds"],
            "batches": rec["batches"], "test_accuracy": rec["test_accuracy"],
            "epoch_train_s": [e["train_seconds"] for e in rec["history"]],
            "threads": thread_info(), "variant": args.variant}


def child_trial_article(args) -> dict:
    import tensorflow as tf  # noqa: F401
    import tf_keras

    set_threads(args.threads)
    root = Path(args.data_dir) / "standard"
    bs = args.batch_size
    t0 = time.perf_counter()
    tf_keras.utils.set_random_seed(0)
    train_it = _article_iterator(root / "train", bs)
    val_it = _article_iterator(root / "validation", bs)
    test_it = _article_iterator(root / "test", bs)
    layers = tf_keras.layers
    model = tf_keras.Sequential([
        layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same",
                      input_shape=(SIZE, SIZE, 3)),
        layers.MaxPooling2D((2, 2)),
        layers.Flatten(),
        layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
        layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=args.optimizer, loss="binary_crossentropy", metrics=["accuracy"])

    class Timer(tf_keras.callbacks.Callback):  # the same split of each epoch as catsdogs' timer
        def __init__(self):
            super().__init__()
            self.train_s = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0, self.t_train = time.perf_counter(), None

        def on_test_begin(self, logs=None):
            if self.t_train is None:
                self.t_train = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.train_s.append((self.t_train or time.perf_counter()) - self.t0)

    timer = Timer()
    fit0 = time.perf_counter()
    # Validation on the real validation iterator, every image (len(val_it) batches, the last
    # partial), as run_trial validates; the article passed train_it with n_val // bs steps.
    model.fit(train_it, validation_data=val_it, steps_per_epoch=train_it.n // bs,
              validation_steps=len(val_it), epochs=args.epochs, callbacks=[timer], verbose=0)
    fit_s = time.perf_counter() - fit0
    _, acc = model.evaluate(test_it, steps=len(test_it), verbose=0)
    work = time.perf_counter() - t0
    return {"work_s": work, "train_s": sum(timer.train_s), "fit_s": fit_s,
            "batches": int(model.optimizer.iterations.numpy()), "test_accuracy": float(acc),
            "epoch_train_s": timer.train_s, "threads": thread_info()}


def child_matmul(args) -> dict:
    import tensorflow as tf

    set_threads(args.threads)
    n = args.matmul_n
    a = tf.random.normal((n, n), dtype=tf.float32, seed=1)
    b = tf.random.normal((n, n), dtype=tf.float32, seed=2)
    for _ in range(3):  # warm-up
        float(tf.matmul(a, b)[0, 0])
    times = []
    for _ in range(args.matmul_reps):
        t = time.perf_counter()
        float(tf.matmul(a, b)[0, 0])  # eager ops on CPU are synchronous; the read makes sure
        times.append(time.perf_counter() - t)
    return {"n": n, "times_s": times, "flops_per_call": 2.0 * n**3, "threads": thread_info()}


CHILDREN = {"pipe-ours": child_pipe_ours, "pipe-article": child_pipe_article,
            "trial-ours": child_trial_ours, "trial-article": child_trial_article,
            "matmul": child_matmul}


# --- the parent: run the children, collect, print the table -------------------------------


def run_child(args, side: str, variant: str = "") -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--data-dir", str(args.data_dir),
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--optimizer", args.optimizer, "--threads", str(args.threads),
           "--matmul-n", str(args.matmul_n), "--matmul-reps", str(args.matmul_reps)]
    if variant:
        cmd += ["--variant", variant]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"child {side} {variant} failed (exit {proc.returncode})")
    out = json.loads(lines[-1][len(PREFIX):])
    out["process_wall_s"] = wall
    label = side + (f"[{variant}]" if variant else "")
    print(f"  {label:<26} {summary(side, out, args)}", flush=True)
    return out


def summary(side: str, r: dict, args) -> str:
    if side.startswith("pipe"):
        imgs = r["steps"] * args.batch_size
        return (f"epochs {', '.join(f'{s:.2f}' for s in r['epoch_s'])} s"
                + (f"; decode {r['decode_s']:.2f} s" if "decode_s" in r else f"; setup {r['setup_s']:.2f} s")
                + f"; {imgs} images/epoch")
    if side.startswith("trial"):
        return (f"train {r['train_s']:.1f} s, fit {r['fit_s']:.1f} s, trial {r['work_s']:.1f} s, "
                f"process {r['process_wall_s']:.1f} s, {r['batches']} batches, "
                f"test acc {r['test_accuracy']:.3f}")
    return f"median {statistics.median(r['times_s']) * 1e3:.1f} ms per {r['n']}^2 matmul"


def med(xs):
    return statistics.median(xs)


def parent(args) -> int:
    import platform
    from importlib import metadata

    variants = [v for v in args.variants.split(",") if v] if args.variants else []
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if not (Path(args.data_dir) / "manifest.json").exists():
        raise SystemExit(f"{args.data_dir} is not prepared: run "
                         f"`catsdogs prepare --source synthetic --data-dir {args.data_dir}`")
    print(f"bench_trial: bs={args.batch_size} epochs={args.epochs} optimizer={args.optimizer} "
          f"repeats={args.repeats} threads={'TF default' if not args.threads else args.threads} "
          f"variants={variants or 'none'}", flush=True)
    res: dict[str, list[dict]] = {k: [] for k in SIDES}
    res.update({f"trial-ours[{v}]": [] for v in variants})
    for r in range(args.repeats):
        print(f"repeat {r + 1}/{args.repeats}", flush=True)
        res["matmul"].append(run_child(args, "matmul"))
        pairs = [("pipe-ours", "pipe-article"), ("trial-ours", "trial-article")]
        for a, b in pairs:
            order = (a, b) if r % 2 == 0 else (b, a)  # alternate who goes first
            for side in order:
                res[side].append(run_child(args, side))
        for v in variants:
            res[f"trial-ours[{v}]"].append(run_child(args, "trial-ours", v))
        res["matmul"].append(run_child(args, "matmul"))  # the peak before and after the trials

    bs, epochs = args.batch_size, args.epochs
    rows = []

    # (a) the input pipeline
    po, pa = res["pipe-ours"], res["pipe-article"]
    steps = po[0]["steps"]
    imgs_epoch = steps * bs
    ours_steady = med([imgs_epoch * epochs / sum(r["epoch_s"]) for r in po])
    ours_whole = med([imgs_epoch * epochs / (r["decode_s"] + sum(r["epoch_s"])) for r in po])
    ours_decode = med([r["decode_s"] for r in po])
    art_steady = med([imgs_epoch * epochs / sum(r["epoch_s"]) for r in pa])
    art_whole = med([imgs_epoch * epochs / (r["setup_s"] + sum(r["epoch_s"])) for r in pa])
    rows.append(("(a) input pipeline, training folder", "", "", ""))
    rows.append(("  images/s, per epoch (steady state)", f"{ours_steady:,.0f}", f"{art_steady:,.0f}",
                 f"{ours_steady / art_steady:.1f}x"))
    rows.append(("  images/s, whole trial's input work", f"{ours_whole:,.0f}", f"{art_whole:,.0f}",
                 f"{ours_whole / art_whole:.1f}x"))
    rows.append(("    (ours incl. one-time decode of", f"{ours_decode:.2f} s", "", ""))
    rows.append((f"     {po[0]['n']} images; batches {po[0]['dtype']} vs {pa[0]['dtype']})", "", "", ""))

    # (b) the whole trial
    to, ta = res["trial-ours"], res["trial-article"]
    rows.append((f"(b) one trial: {epochs} epochs x {steps} steps, val, test", "", "", ""))
    for key, name in (("train_s", "training time, s"), ("fit_s", "fit incl. validation, s"),
                      ("work_s", "trial excl. imports, s"), ("process_wall_s", "process wall incl. imports, s")):
        o, a = med([r[key] for r in to]), med([r[key] for r in ta])
        rows.append((f"  {name}", f"{o:.1f}", f"{a:.1f}", f"{a / o:.2f}x"))
    rows.append(("  test accuracy (median)", f"{med([r['test_accuracy'] for r in to]):.3f}",
                 f"{med([r['test_accuracy'] for r in ta]):.3f}", ""))
    for v in variants:
        tv = res[f"trial-ours[{v}]"]
        o, a = med([r["train_s"] for r in tv]), med([r["train_s"] for r in ta])
        w = med([r["work_s"] for r in tv])
        rows.append((f"  ours[{v}] training / trial s", f"{o:.1f} / {w:.1f}",
                     f"{a:.1f} / {med([r['work_s'] for r in ta]):.1f}", f"{a / o:.2f}x / "
                     f"{med([r['work_s'] for r in ta]) / w:.2f}x"))

    # (c) achieved FLOP/s
    from catsdogs.model import train_flops_per_image

    mm = res["matmul"]
    peak = med([r["flops_per_call"] / t for r in mm for t in r["times_s"]])
    fpi = train_flops_per_image(SIZE)
    trained = to[0]["batches"] * bs
    achieved = med([fpi * trained / r["train_s"] for r in to])
    achieved_art = med([fpi * ta[0]["batches"] * bs / r["train_s"] for r in ta])
    rows.append(("(c) training FLOP/s", "", "", ""))
    rows.append((f"  matmul peak ({args.matmul_n}^2 float32), GFLOP/s", f"{peak / 1e9:.1f}", "", ""))
    rows.append((f"  achieved ({fpi / 1e6:.0f} MFLOP/img x {trained})", f"{achieved / 1e9:.1f}",
                 f"{achieved_art / 1e9:.1f}", ""))
    rows.append(("  fraction of peak", f"{achieved / peak:.1%}", f"{achieved_art / peak:.1%}", ""))
    for v in variants:
        tv = res[f"trial-ours[{v}]"]
        rows.append((f"  ours[{v}] fraction of peak", f"{med([fpi * trained / r['train_s'] for r in tv]) / peak:.1%}",
                     "", ""))

    import tensorflow as tf  # only for the versions line; after the children

    th = to[0]["threads"]
    print()
    print(f"cores: {os.cpu_count()} ({platform.processor() or platform.machine()}); "
          f"TF {tf.__version__}, Keras {metadata.version('keras')}, tf_keras {metadata.version('tf_keras')}, "
          f"Python {platform.python_version()}; TF threads intra={th['intra']} inter={th['inter']} (0 = TF default)")
    print(f"batch size {bs}, {epochs} epochs, {args.optimizer}, float32; medians of {args.repeats} "
          f"repeat(s); ratio = ours faster by; imports excluded unless stated")
    w = max(len(r[0]) for r in rows) + 2
    print(f"{'':<{w}}{'ours':>16}{'article way':>16}{'ratio':>16}")
    for name, a, b, c in rows:
        print(f"{name:<{w}}{a:>16}{b:>16}{c:>16}")
    print()
    print(f"targets: pipeline steady state >= 20x: {'met' if ours_steady / art_steady >= 20 else 'MISSED'}; "
          f"whole trial (training time) >= 1.5x: "
          f"{'met' if med([r['train_s'] for r in ta]) / med([r['train_s'] for r in to]) >= 1.5 else 'MISSED'}"
          f"; (trial excl. imports) "
          f"{'met' if med([r['work_s'] for r in ta]) / med([r['work_s'] for r in to]) >= 1.5 else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
        print(f"raw results: {args.json}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="a prepared folder (catsdogs prepare)")
    p.add_argument("--repeats", type=int, default=None, help="repeats of every measurement (default 3; --quick 1)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=None, help="default 5 (the article's); --quick 2")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--quick", action="store_true", help="one repeat of 2 epochs")
    p.add_argument("--threads", type=int, default=0,
                   help="TF intra- and inter-op threads for every child (0: TF's default)")
    p.add_argument("--variants", default="", help=f"extra runs of our trial: {', '.join(VARIANTS)}")
    p.add_argument("--matmul-n", type=int, default=2048)
    p.add_argument("--matmul-reps", type=int, default=10)
    p.add_argument("--json", help="write the raw per-run results here")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.epochs is None:
        args.epochs = 2 if args.quick else 5
    if args.side:
        emit(CHILDREN[args.side](args))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
