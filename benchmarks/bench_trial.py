"""Benchmark one trial of the case study: our Keras 3 / tf.data path against the article's way.

The article (Keras 2) read every batch from disk with
``ImageDataGenerator(rescale=1/255).flow_from_directory(..., class_mode='binary',
target_size=(200, 200))`` and trained with ``model.fit(train_it, steps_per_epoch=n // bs, ...)``.
catsdogs decodes each image once into uint8 memory and serves batches with tf.data
(catsdogs.data.loading), and trains with Keras 3 (catsdogs.training.engine.run_trial). This script measures, on
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

    python benchmarks/bench_trial.py --data-dir /tmp/bdata              # the full run
    python benchmarks/bench_trial.py --data-dir /tmp/bdata --quick      # a shorter one
    python benchmarks/bench_trial.py --data-dir /tmp/bdata --variants kerasadam,bf16  # what-ifs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import spread
from harness import table as markdown_table

from catsdogs.host import cpu_name

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

PREFIX = "@@bench "
SIZE = 200
SIDES = ("pipe-ours", "pipe-article", "trial-ours", "trial-article", "matmul")

# What-if changes to our trial, applied by monkeypatching in the child (catsdogs is not edited).
# Parts combine with '+', e.g. "bf16+kerasadam".
VARIANT_PARTS = {
    "sysalloc": "TensorFlow's default CPU allocator (glibc malloc) instead of the BFC allocator catsdogs' workers use",
    "jemalloc": "the BFC allocator off and jemalloc preloaded (LD_PRELOAD; Debian's libjemalloc2 must be installed)",
    "kerasadam": "Keras 3's own Adam (a dozen element-wise passes per variable) instead of our fused one",
    "bf16": "precision mixed_bfloat16 instead of float32 (changes the numerics)",
    "nodet": "no tf.config.experimental.enable_op_determinism()",
    "jit": "model.compile(jit_compile=True) (XLA); Keras ignores it while op determinism is on",
    "f32in": "the pipeline hands float32 pixels in 0..1 to a model without Rescaling",
    "pildecode": "load_split: Pillow in os.cpu_count() threads into a preallocated array (catsdogs' own now)",
    "tfdecode": "load_split: tf.io.decode_jpeg(dct_method='INTEGER_ACCURATE') in tf.data",
}
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
PIPE_PARTS = {"pildecode", "tfdecode"}  # variants with only these run on (a), not (b)


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
    import numpy as np
    import tensorflow as tf  # noqa: F401 - imported before the clock starts

    from catsdogs.data import loading
    from catsdogs.runtime.backends import tensorflow as tf_backend

    set_threads(args.threads)
    _apply_variant(args.variant)
    t0, c0 = time.perf_counter(), time.process_time()
    train = loading.load_split(Path(args.data_dir) / "standard" / "train")
    decode, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = len(train) // args.batch_size
    batches = iter(tf_backend.train_batches(train, args.batch_size, seed=0, n_batches=steps * args.epochs))
    epochs, cpus, touched = [], [], 0
    for _ in range(args.epochs):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(steps):  # one epoch: n // bs full batches, from one iterator, as fit reads them
            x, y = next(batches)
            # np.asarray: the batch as a numpy array on the tensor's own memory; .numpy() would
            # add a copy of it that training never makes
            xa, ya = np.asarray(x), np.asarray(y)
            touched += int(xa[-1, -1, -1, -1]) + int(ya[-1])  # read from the materialised arrays
        epochs.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return {"decode_s": decode, "decode_cpu_s": decode_cpu, "epoch_s": epochs, "epoch_cpu_s": cpus, "steps": steps, "n": len(train),
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
    t0, c0 = time.perf_counter(), time.process_time()
    it = _article_iterator(Path(args.data_dir) / "standard" / "train", args.batch_size)
    setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = it.n // args.batch_size
    epochs, cpus, touched = [], [], 0
    for _ in range(args.epochs):
        t, c = time.perf_counter(), time.process_time()
        for i in range(steps):  # the full batches of this epoch's shuffle, as fit would see them
            x, y = it[i]
            touched += int(x[-1, -1, -1, -1]) + int(y[-1])
        it.on_epoch_end()  # reshuffle, as Keras does between epochs
        epochs.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return {"setup_s": setup, "setup_cpu_s": setup_cpu, "epoch_s": epochs, "epoch_cpu_s": cpus, "steps": steps, "n": it.n,
            "dtype": str(x.dtype), "threads": thread_info()}


def _fast_load_split(use_tf: bool):
    """A drop-in for catsdogs.data.loading.load_split that decodes faster to the same pixels.

    Pillow's decoder and tf.io.decode_jpeg with dct_method='INTEGER_ACCURATE' (libjpeg's
    ISLOW DCT, fancy upsampling) give identical pixels on images prepare wrote (checked on all
    5,200 synthetic ones); TF's default DCT ('INTEGER_FAST') does not."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from PIL import Image

    from catsdogs import config
    from catsdogs.data import loading

    def load_split(folder):
        paths, labels = [], []
        for label, cls in enumerate(config.CLASSES):
            files = sorted((Path(folder) / cls).glob("*.jpg"))
            paths += files
            labels += [label] * len(files)
        if not paths:
            raise FileNotFoundError(f"no images under {folder}")
        if use_tf:
            import tensorflow as tf

            ds = tf.data.Dataset.from_tensor_slices([str(p) for p in paths]).map(
                lambda p: tf.io.decode_jpeg(tf.io.read_file(p), channels=3, dct_method="INTEGER_ACCURATE"),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(len(paths))
            images = next(iter(ds)).numpy()
        else:
            with Image.open(paths[0]) as img:
                w, h = img.size
            images = np.empty((len(paths), h, w, 3), np.uint8)

            def decode_into(i):
                with Image.open(paths[i]) as img:
                    img = img if img.mode == "RGB" else img.convert("RGB")
                    images[i] = np.asarray(img)

            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                list(pool.map(decode_into, range(len(paths))))
        return loading.Split(images, np.asarray(labels, dtype=np.float32),
                          [str(p.relative_to(folder)) for p in paths])

    return load_split


def _apply_variant(variant: str) -> set[str]:
    """Monkeypatch catsdogs / Keras for a what-if run of our trial."""
    import keras
    import tensorflow as tf

    parts = set(variant.split("+")) if variant else set()
    if parts & PIPE_PARTS:
        from catsdogs.data import loading

        loading.load_split = _fast_load_split("tfdecode" in parts)
    if "kerasadam" in parts:
        from catsdogs.runtime.backends import tensorflow as tf_backend

        tf_backend.adam_class = lambda fused: keras.optimizers.Adam
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

        from catsdogs.data import loading
        from catsdogs.training import steps

        load = loading.load_split

        def load_float(folder):
            split = load(folder)
            split.images = split.images.astype(np.float32) / np.float32(255)
            return split

        loading.load_split = load_float

        def build_float(size: int = SIZE):
            """catsdogs.training.model.build_model with float32 pixels in, so no Rescaling layer; the
            last layer outputs the logit, as the model does (the loss applies the sigmoid)."""
            return keras.Sequential([
                keras.Input((size, size, 3)),
                layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"),
                layers.MaxPooling2D((2, 2)),
                layers.Flatten(),
                layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
                layers.Dense(1, dtype="float32"),
            ])

        steps.build_model = build_float  # a worker's steps build (and rebuild, per seed) by this name
    return parts


def _cpu_timer(cpu: dict):
    """Wrap the engine's epoch timer so it also sums the process CPU time of training."""
    from catsdogs.training import engine as trial

    make = trial.EpochTimer

    def timed(n_epochs, on_epoch=None, *args, **kwargs):
        t = make(n_epochs, on_epoch, *args, **kwargs)
        begin, test_begin, end = t.on_epoch_begin, t.on_test_begin, t.on_epoch_end
        state = {}

        def on_epoch_begin(epoch, logs=None):
            state["c0"], state["ct"] = time.process_time(), None
            begin(epoch, logs)

        def on_test_begin(logs=None):
            if state["ct"] is None:
                state["ct"] = time.process_time()
            test_begin(logs)

        def on_epoch_end(epoch, logs=None):
            cpu["train"] += (state["ct"] or time.process_time()) - state["c0"]
            end(epoch, logs)

        t.on_epoch_begin, t.on_test_begin, t.on_epoch_end = on_epoch_begin, on_test_begin, on_epoch_end
        return t

    trial.EpochTimer = timed


def child_trial_ours(args) -> dict:
    import keras  # noqa: F401
    import tensorflow as tf  # noqa: F401

    from catsdogs.schema import TrialConfig
    from catsdogs.training.costs import train_flops_per_image
    from catsdogs.training.engine import run_trial

    set_threads(args.threads)
    parts = _apply_variant(args.variant)
    cpu = {"train": 0.0}
    _cpu_timer(cpu)
    cfg = TrialConfig(optimizer=args.optimizer, batch_size=args.batch_size, dataset="standard",
                      seed=0, epochs=args.epochs, image_size=SIZE,
                      precision="mixed_bfloat16" if "bf16" in parts else "float32")
    t0, c0 = time.perf_counter(), time.process_time()
    rec = run_trial(cfg, Path(args.data_dir))
    work, work_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"work_s": work, "work_cpu_s": work_cpu, "train_cpu_s": cpu["train"],
            "train_s": rec.train_seconds, "fit_s": rec.fit_seconds,
            "batches": rec.batches, "test_accuracy": rec.test_accuracy,
            "epoch_train_s": [e["train_seconds"] for e in rec.history],
            "threads": thread_info(), "variant": args.variant,
            "flops_per_image": train_flops_per_image(SIZE)}


def child_trial_article(args) -> dict:
    import tensorflow as tf  # noqa: F401
    import tf_keras

    set_threads(args.threads)
    root = Path(args.data_dir) / "standard"
    bs = args.batch_size
    t0, c0 = time.perf_counter(), time.process_time()
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
            self.train_s, self.train_cpu_s = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0, self.t_train = time.perf_counter(), None
            self.c0, self.c_train = time.process_time(), None

        def on_test_begin(self, logs=None):
            if self.t_train is None:
                self.t_train, self.c_train = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.train_s.append((self.t_train or time.perf_counter()) - self.t0)
            self.train_cpu_s.append((self.c_train or time.process_time()) - self.c0)

    timer = Timer()
    fit0 = time.perf_counter()
    # Validation on the real validation iterator, every image (len(val_it) batches, the last
    # partial), as run_trial validates; the article passed train_it with n_val // bs steps.
    model.fit(train_it, validation_data=val_it, steps_per_epoch=train_it.n // bs,
              validation_steps=len(val_it), epochs=args.epochs, callbacks=[timer], verbose=0)
    fit_s = time.perf_counter() - fit0
    _, acc = model.evaluate(test_it, steps=len(test_it), verbose=0)
    work, work_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"work_s": work, "work_cpu_s": work_cpu, "train_cpu_s": sum(timer.train_cpu_s),
            "train_s": sum(timer.train_s), "fit_s": fit_s,
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
    times, cpus = [], []
    for _ in range(args.matmul_reps):
        t, c = time.perf_counter(), time.process_time()
        float(tf.matmul(a, b)[0, 0])  # eager ops on CPU are synchronous; the read makes sure
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return {"n": n, "times_s": times, "cpu_s": cpus, "flops_per_call": 2.0 * n**3, "threads": thread_info()}


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
    # Our side runs in the environment a catsdogs worker gets (its allocator), unless the
    # variant asks for the system's; the article's side keeps TensorFlow's defaults.
    from catsdogs.runtime.backends import tensorflow as tf_backend

    env = dict(os.environ)
    parts = set(variant.split("+"))
    if side.endswith("-ours") and not parts & {"sysalloc", "jemalloc"}:
        env.update(tf_backend.process_env())
    if "jemalloc" in parts:
        env["LD_PRELOAD"] = JEMALLOC
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
        first = (f"decode {r['decode_s']:.2f} s" if "decode_s" in r else f"setup {r['setup_s']:.2f} s")
        return (f"{first}; epochs {', '.join(f'{s:.2f}' for s in r['epoch_s'])} s wall "
                f"({', '.join(f'{s:.2f}' for s in r['epoch_cpu_s'])} s CPU); {imgs} images/epoch")
    if side.startswith("trial"):
        return (f"train {r['train_s']:.1f} s ({r['train_cpu_s']:.1f} CPU), fit {r['fit_s']:.1f} s, "
                f"trial {r['work_s']:.1f} s ({r['work_cpu_s']:.1f} CPU), process {r['process_wall_s']:.1f} s, "
                f"{r['batches']} batches, test acc {r['test_accuracy']:.3f}")
    return (f"median {med(r['times_s']) * 1e3:.0f} ms wall, "
            f"{med(r['cpu_s']) * 1e3:.0f} ms CPU per {r['n']}^2 matmul")


def med(xs):
    return spread(xs)[0]


def _steady(r: dict, key: str) -> list[float]:
    """Per-epoch seconds after the first (tf.data start-up, caches); all if only one."""
    return r[key][1:] or r[key]


def parent(args) -> int:
    if args.from_json:  # re-print the table of an earlier run
        saved = json.loads(Path(args.from_json).read_text())
        for k in ("batch_size", "epochs", "repeats", "matmul_n"):
            setattr(args, k, int(saved["args"][k]))
        args.optimizer = saved["args"]["optimizer"]
        return table(args, saved["results"], saved["variants"], saved["minutes"])
    variants = [v for v in args.variants.split(",") if v] if args.variants else []
    for v in variants:
        for part in v.split("+"):
            if part not in VARIANT_PARTS:
                raise SystemExit(f"unknown variant part {part!r}; choose from {', '.join(VARIANT_PARTS)}")
    if not (Path(args.data_dir) / "manifest.json").exists():
        raise SystemExit(f"{args.data_dir} is not prepared: run "
                         f"`catsdogs prepare --source synthetic --data-dir {args.data_dir}`")
    print(f"bench_trial: bs={args.batch_size} epochs={args.epochs} optimizer={args.optimizer} "
          f"repeats={args.repeats} threads={'TF default' if not args.threads else args.threads} "
          f"variants={variants or 'none'}", flush=True)
    for v in variants:
        print(f"  variant {v}: " + "; ".join(VARIANT_PARTS[p] for p in v.split("+")))
    res: dict[str, list[dict]] = {k: [] for k in SIDES}
    pipe_variants = [v for v in variants if set(v.split("+")) & PIPE_PARTS]
    trial_variants = [v for v in variants if set(v.split("+")) - PIPE_PARTS]
    res.update({f"pipe-ours[{v}]": [] for v in pipe_variants})
    res.update({f"trial-ours[{v}]": [] for v in trial_variants})
    started = time.perf_counter()
    for r in range(args.repeats):
        print(f"repeat {r + 1}/{args.repeats}", flush=True)
        if args.only != "pipe":  # the peak is for (c), measured before and after the trials
            res["matmul"].append(run_child(args, "matmul"))
        for a, b in (("pipe-ours", "pipe-article"), ("trial-ours", "trial-article")):
            if args.only and not a.startswith(args.only):
                continue
            for side in ((a, b) if r % 2 == 0 else (b, a)):  # alternate who goes first
                res[side].append(run_child(args, side))
        for v in pipe_variants if args.only != "trial" else []:
            res[f"pipe-ours[{v}]"].append(run_child(args, "pipe-ours", v))
        for v in trial_variants if args.only != "pipe" else []:
            res[f"trial-ours[{v}]"].append(run_child(args, "trial-ours", v))
        if args.only != "pipe":
            res["matmul"].append(run_child(args, "matmul"))
        if args.json:  # after every repeat, so an interrupted run keeps what it measured
            Path(args.json).write_text(json.dumps(
                {"results": res, "variants": variants, "minutes": (time.perf_counter() - started) / 60,
                 "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return table(args, res, variants, (time.perf_counter() - started) / 60)


def table(args, res: dict, variants: list[str], minutes: float) -> int:
    import platform
    from importlib import metadata

    pipe_variants = [v for v in variants if set(v.split("+")) & PIPE_PARTS]
    trial_variants = [v for v in variants if set(v.split("+")) - PIPE_PARTS]
    bs, epochs = args.batch_size, args.epochs
    rows: list[tuple[str, str, str, str]] = []

    def row(name, ours, art, fmt, higher_is_better=True):
        ratio = (ours / art if higher_is_better else art / ours) if ours and art else None
        rows.append((name, format(ours, fmt) if ours is not None else "",
                     format(art, fmt) if art is not None else "", f"{ratio:.2f}x" if ratio else ""))

    po, pa, to, ta = res["pipe-ours"], res["pipe-article"], res["trial-ours"], res["trial-article"]
    if po:
        # (a) the input pipeline
        steps = po[0]["steps"]
        per_epoch = steps * bs
        total = per_epoch * epochs
        rows.append((f"(a) input pipeline: {po[0]['n']} training images, {steps} batches of {bs} x {epochs} epochs", "", "", ""))
        steady = {side: med([per_epoch / med(_steady(r, "epoch_s")) for r in runs])
                  for side, runs in (("ours", po), ("article", pa))}
        row("  images/s per epoch, steady state (wall)", steady["ours"], steady["article"], ",.0f")
        row("  images/s per epoch, steady state (per CPU-s)",
            med([per_epoch / max(med(_steady(r, "epoch_cpu_s")), 1e-9) for r in po]),
            med([per_epoch / max(med(_steady(r, "epoch_cpu_s")), 1e-9) for r in pa]), ",.0f")
        row("  first epoch, s (wall)", med([r["epoch_s"][0] for r in po]), med([r["epoch_s"][0] for r in pa]),
            ".2f", higher_is_better=False)
        rows.append(("  one-time decode (ours) / iterator setup, s", f"{med([r['decode_s'] for r in po]):.2f}",
                     f"{med([r['setup_s'] for r in pa]):.2f}", ""))
        ours_whole = med([total / (r["decode_s"] + sum(r["epoch_s"])) for r in po])
        art_whole = med([total / (r["setup_s"] + sum(r["epoch_s"])) for r in pa])
        row("  images/s, whole trial's input work (wall)", ours_whole, art_whole, ",.0f")
        row("  images/s, whole trial's input work (per CPU-s)",
            med([total / (r["decode_cpu_s"] + sum(r["epoch_cpu_s"])) for r in po]),
            med([total / (r["setup_cpu_s"] + sum(r["epoch_cpu_s"])) for r in pa]), ",.0f")
        for v in pipe_variants:
            pv = res[f"pipe-ours[{v}]"]
            row(f"  ours[{v}] one-time decode, s (wall)", med([r["decode_s"] for r in pv]),
                med([r["decode_s"] for r in po]), ".2f", higher_is_better=False)
            row(f"  ours[{v}] one-time decode, CPU s", med([r["decode_cpu_s"] for r in pv]),
                med([r["decode_cpu_s"] for r in po]), ".2f", higher_is_better=False)
            row(f"  ours[{v}] images/s, whole trial's input work", med([total / (r["decode_s"] + sum(r["epoch_s"])) for r in pv]),
                art_whole, ",.0f")
        if pipe_variants:
            rows.append(("  (decode rows: ours[variant] vs ours as is)", "", "", ""))
        rows.append((f"  (batches: ours {po[0]['dtype']}, article {pa[0]['dtype']} scaled to 0..1)", "", "", ""))

    if to:
        # (b) the whole trial
        rows.append((f"(b) one trial: {epochs} epochs x {to[0]['batches'] // epochs} steps + validation + test", "", "", ""))
        for key, name in (("train_s", "training, s (wall)"), ("train_cpu_s", "training, CPU s"),
                          ("fit_s", "fit incl. validation, s (wall)"), ("work_s", "trial excl. imports, s (wall)"),
                          ("work_cpu_s", "trial excl. imports, CPU s"),
                          ("process_wall_s", "process incl. imports, s (wall)")):
            row(f"  {name}", med([r[key] for r in to]), med([r[key] for r in ta]), ".1f", higher_is_better=False)
        rows.append(("  test accuracy (median)", f"{med([r['test_accuracy'] for r in to]):.3f}",
                     f"{med([r['test_accuracy'] for r in ta]):.3f}", ""))
        for v in trial_variants:
            tv = res[f"trial-ours[{v}]"]
            for key, name in (("train_s", "training, s (wall)"), ("train_cpu_s", "training, CPU s"),
                              ("work_s", "trial excl. imports, s (wall)")):
                row(f"  ours[{v}] {name}", med([r[key] for r in tv]), med([r[key] for r in ta]), ".1f",
                    higher_is_better=False)
            rows.append((f"  ours[{v}] test accuracy", f"{med([r['test_accuracy'] for r in tv]):.3f}", "", ""))

        # (c) achieved FLOP/s
        mm = res["matmul"]
        peak = med([r["flops_per_call"] / t for r in mm for t in r["times_s"]])
        peak_cpu = med([r["flops_per_call"] / max(c, 1e-9) for r in mm for c in r["cpu_s"]])
        fpi = to[0]["flops_per_image"]

        def achieved(runs, key):
            return med([fpi * r["batches"] * bs / r[key] for r in runs])

        rows.append((f"(c) training FLOP/s ({fpi / 1e6:.0f} MFLOP per image trained)", "", "", ""))
        rows.append((f"  float32 {args.matmul_n}^2 matmul peak, GFLOP/s (wall)", f"{peak / 1e9:.1f}", "", ""))
        rows.append(("  ... per CPU-second, GFLOP", f"{peak_cpu / 1e9:.1f}", "", ""))
        row("  achieved in training, GFLOP/s (wall)", achieved(to, "train_s") / 1e9, achieved(ta, "train_s") / 1e9, ".1f")
        row("  ... per CPU-second, GFLOP", achieved(to, "train_cpu_s") / 1e9, achieved(ta, "train_cpu_s") / 1e9, ".1f")
        rows.append(("  fraction of peak (wall)", f"{achieved(to, 'train_s') / peak:.1%}",
                     f"{achieved(ta, 'train_s') / peak:.1%}", ""))
        rows.append(("  fraction of peak (per CPU-s)", f"{achieved(to, 'train_cpu_s') / peak_cpu:.1%}",
                     f"{achieved(ta, 'train_cpu_s') / peak_cpu:.1%}", ""))
        for v in trial_variants:
            tv = res[f"trial-ours[{v}]"]
            rows.append((f"  ours[{v}] fraction of peak (wall / CPU-s)",
                         f"{achieved(tv, 'train_s') / peak:.1%} / {achieved(tv, 'train_cpu_s') / peak_cpu:.1%}", "", ""))

    th = (to or po)[0]["threads"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(f"cores: {os.cpu_count()} ({cpu_name()}); TF {metadata.version('tensorflow')}, Keras {metadata.version('keras')}, "
          f"tf_keras {metadata.version('tf_keras')}, Python {platform.python_version()}; "
          f"TF threads intra={th['intra']} inter={th['inter']} (0 = TF default: one per core)")
    print(f"batch size {bs}, {epochs} epochs, {args.optimizer}, float32 unless a variant says otherwise; "
          f"medians of {args.repeats} repeat(s), each side in its own process; imports excluded unless "
          f"stated; ratio = how many times ours is faster; load average at the end {load:.1f}; "
          f"bench took {minutes:.1f} min")
    print(markdown_table(("", "ours", "article way", "ratio"), rows))
    print()
    found = []
    if po:
        pipe_ratio = steady["ours"] / steady["article"]
        found.append(f"(a) pipeline steady state >= 20x: {pipe_ratio:.1f}x "
                     f"{'met' if pipe_ratio >= 20 else 'MISSED'} (whole trial's input work {ours_whole / art_whole:.1f}x)")
    if to:
        def ratio(key):
            return med([r[key] for r in ta]) / med([r[key] for r in to])

        found.append(f"(b) whole trial >= 2x faster: {ratio('work_s'):.2f}x wall "
                     f"{'met' if ratio('work_s') >= 2 else 'MISSED'} ({ratio('process_wall_s'):.2f}x with "
                     f"imports; CPU time {ratio('work_cpu_s'):.2f}x; training alone {ratio('train_s'):.2f}x wall, "
                     f"{ratio('train_cpu_s'):.2f}x CPU)")
    print("targets: " + "; ".join(found))
    if args.json and not args.from_json:
        print(f"raw results: {args.json} (re-print with --from-json)")
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
    p.add_argument("--only", choices=["pipe", "trial"], help="measure (a) alone, or (b) and (c) alone")
    p.add_argument("--threads", type=int, default=0,
                   help="TF intra- and inter-op threads for every child (0: TF's default)")
    p.add_argument("--variants", default="", help="extra runs of our trial, comma-separated; parts joined by +: " + ", ".join(VARIANT_PARTS))
    p.add_argument("--matmul-n", type=int, default=2048)
    p.add_argument("--matmul-reps", type=int, default=10)
    p.add_argument("--json", help="write the raw per-run results here")
    p.add_argument("--from-json", help="print the table of results an earlier --json run saved")
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
