"""The article's first convolution on XLA:CPU, padded to four channels (catsdogs.runtime.backends.jax_conv) or XLA's own.

Two parts, both on JAX on this CPU:

- `--grid`: a 3x3 convolution alone (batch 32, 64 px, `same`) over input channels 1 to 4 and
  filters 8 to 128, XLA's own against the input and kernel given zero channels up to 4 (8 for 4):
  the milliseconds of each, medians of 15 taken in turn. Where padding wins is what
  jax_conv.SLOW lists; a new jaxlib may move it.
- the trials (default): one-epoch trials of the article's model (SGD at 0.05) as `catsdogs sweep`
  runs them, in a fresh JAX worker process a side a round (A B A B), the routed convolution and
  XLA's own (`nn.conv` put back to Keras's function before the first trial); each process runs
  its batch sizes, the first trial of each only compiling. Prints each side's median
  milliseconds a training step and seconds an evaluation of the validation split, and their
  ratios.

    KERAS_BACKEND=jax python benchmarks/bench_jax_conv.py --data-dir /tmp/b/data --batch-size 8 16 64
    KERAS_BACKEND=jax python benchmarks/bench_jax_conv.py --grid
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import HERE, alternate, run_snippet, table

TRIALS = r"""
import json, sys
from pathlib import Path
from catsdogs.manifest import load_manifest
from catsdogs.runtime import backends
backend = backends.current()
backend.start()
import keras.src.backend.jax.nn as nn
from catsdogs.runtime.backends import jax_conv
if sys.argv[2] == "xla":  # Keras's own, and kept so: each trial's start would install it again
    jax_conv.install = lambda: False
    nn.conv = getattr(nn.conv, "__wrapped__", nn.conv)
from catsdogs.schema import TrialConfig
from catsdogs.training import engine
data_dir = Path(sys.argv[1])
data = load_manifest(data_dir)
out = {}
for batch in map(int, sys.argv[4:]):
    rows = []
    for seed in range(int(sys.argv[3]) + 1):
        cfg = TrialConfig("sgd", batch, "standard", seed, epochs=1, image_size=data["params"]["size"],
                          data=data["fingerprint"]["standard"], lr=0.05, backend=backend.NAME,
                          **backends.process_settings())
        r = engine.run_trial(cfg, data_dir)
        h = r.history[-1]
        rows.append([1000 * r.train_seconds / r.batches, h["seconds"] - h["train_seconds"], h.get("val_loss")])
    out[batch] = rows[1:]  # the first compiled the step
out["routed"] = getattr(nn.conv, jax_conv.MARK, False)
print(json.dumps(out))
"""


def grid() -> int:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def timed(fs, x):  # the functions in turn, 15 rounds: each one's median milliseconds
        for f in fs:
            f(x).block_until_ready()
        times: list[list[float]] = [[] for _ in fs]
        for _ in range(15):
            for f, kept in zip(fs, times, strict=True):
                started = time.perf_counter()
                f(x).block_until_ready()
                kept.append(time.perf_counter() - started)
        return [1000 * statistics.median(t) for t in times]

    key, rows, dims = jax.random.PRNGKey(0), [], ("NHWC", "HWIO", "NHWC")
    for channels in (1, 2, 3, 4):
        to = 4 if channels < 4 else 8
        row = [f"{channels} (to {to})"]
        for filters in (8, 16, 32, 64, 128):
            kernel = jax.random.normal(key, (3, 3, channels, filters))
            x = jax.random.uniform(key, (32, 64, 64, channels))
            own = jax.jit(lambda v, k=kernel: lax.conv_general_dilated(v, k, (1, 1), "SAME", dimension_numbers=dims).sum())
            extra = to - channels
            padded = jax.jit(lambda v, k=kernel, e=extra: lax.conv_general_dilated(
                jnp.pad(v, ((0, 0),) * 3 + ((0, e),)), jnp.pad(k, ((0, 0),) * 2 + ((0, e), (0, 0))), (1, 1), "SAME",
                dimension_numbers=dims).sum())
            a, b = timed([own, padded], x)
            row.append(f"{a:.1f} / {b:.1f}" + (" *" if b < 0.8 * a else ""))
        rows.append(row)
    print(f"jaxlib {jax.__version__}: a 3x3 convolution, batch 32, 64 px, ms, XLA's own / padded (* padded 0.8x or less):")
    print(table(["input channels", *(f"{f} filters" for f in (8, 16, 32, 64, 128))], rows))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, help="a prepared folder (the trials)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[8, 16, 64], help="default 8 16 64")
    ap.add_argument("--seeds", type=int, default=3, help="timed trials a batch size a process (default 3)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, each side once a round (default 3)")
    ap.add_argument("--grid", action="store_true", help="the convolution alone over channels and filters")
    args = ap.parse_args()
    if args.grid:
        return grid()
    if args.data_dir is None:
        ap.error("--data-dir is needed for the trials (or --grid)")

    def side(way: str):
        return lambda turn: run_snippet(TRIALS, [args.data_dir, way, args.seeds, *args.batch_size], HERE, "jax",
                                        what=f"the {way} trials")

    runs = alternate({"padded": side("padded"), "xla": side("xla")}, args.repeats)
    if not all(r["routed"] for r in runs["padded"]) or any(r["routed"] for r in runs["xla"]):
        sys.exit("the convolution was not routed as each side needs")
    rows, losses = [], []
    for batch in map(str, args.batch_size):
        step, evaluation = ({way: statistics.median(t[i] for r in rs for t in r[batch]) for way, rs in runs.items()}
                            for i in (0, 1))
        rows.append([batch, f"{step['padded']:.2f} / {step['xla']:.2f} ({step['padded'] / step['xla']:.2f})",
                     f"{evaluation['padded']:.3f} / {evaluation['xla']:.3f} ({evaluation['padded'] / evaluation['xla']:.2f})"])
        losses += [abs(a[2] - b[2]) for a, b in zip(runs["padded"][0][batch], runs["xla"][0][batch], strict=True)]
    print(f"JAX, one-epoch trials (SGD at 0.05), {args.seeds} timed a batch size a process, {args.repeats} rounds a side,"
          " padded / XLA's own (ratio):")
    print(table(["batch", "ms a training step", "s a validation"], rows))
    print(f"the epoch's validation loss, padded against XLA's own, the same seeds: at most {max(losses):.2e} apart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
