"""Benchmark the weights digest: what it adds to a trial's wall time, now (hashed in a thread
while the trial evaluates) against before (copied and hashed after it, on the critical path).

The same trials, in one process, at 200 px (the article's model: a 164 MB Dense kernel), with the
article's 400 test images (what a trial evaluates while the digest runs), alternating the two
ways trial by trial. "Before" is catsdogs 0.8.0's digest: each weight copied to the host,
`tobytes()` (a second copy), hashed in order, all on the trial's thread. The digest's value is the
same both ways (checked). Prints per way the median trial wall time and what the digest itself
held the trial up (`digest_seconds`: its start and its wait; before: its whole time).

    catsdogs prepare --source synthetic --size 200 --per-class 280 --split 60,20,200 --data-dir /tmp/d200
    python benchmarks/bench_digest.py --data-dir /tmp/d200 --trials 4
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from harness import spread, table

TARGET = 0.05  # seconds a trial, at most


def serial_digest(model) -> str:
    """catsdogs 0.8.0's digest, on the trial's thread."""
    import keras

    h = hashlib.blake2b(digest_size=16)
    for w in model.weights:
        h.update(keras.ops.convert_to_numpy(w).tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data at 200 px")
    ap.add_argument("--trials", type=int, default=4, help="trials each way [4]")
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()
    from catsdogs.manifest import require_prepared
    from catsdogs.runtime import backends
    from catsdogs.schema import TrialConfig

    backends.current().start()  # before Keras imports the framework: the process's settings (XLA's flags)
    from catsdogs.training import engine

    manifest = require_prepared(a.data_dir)
    threaded = engine.start_weights_digest
    before = {"wall": [], "digest": []}
    now = {"wall": [], "digest": []}
    print(f"{backends.name()}, {manifest['params']['size']} px, {manifest['counts']}", flush=True)
    for i in range(2 * a.trials + 1):  # the first only warms up: it builds and compiles
        old = i % 2 == 1
        held = {}

        def on_path(model, held=held):
            started = time.perf_counter()
            value = serial_digest(model)
            held["seconds"] = time.perf_counter() - started
            return lambda: value

        def watching(model, held=held):
            held["model"] = model
            return threaded(model)

        engine.start_weights_digest = on_path if old else watching
        cfg = TrialConfig("adam", a.batch_size, "standard", i, epochs=1, image_size=manifest["params"]["size"],
                          data=manifest["fingerprint"]["standard"], backend=backends.name())
        record = engine.run_trial(cfg, a.data_dir)
        engine.start_weights_digest = threaded
        if not old and record.weights_digest != serial_digest(held["model"]):  # the trained model, as it ended
            sys.exit(f"trial {i}: the digest differs from catsdogs 0.8.0's")
        if i == 0:
            continue
        side = before if old else now
        side["wall"].append(record.wall_seconds)
        side["digest"].append(held["seconds"] if old else record.digest_seconds)
        print(f"  trial {i} ({'before' if old else 'now'}): wall {record.wall_seconds:.2f} s, digest held it "
              f"{side['digest'][-1]:.3f} s", flush=True)
    sides = (("before: on the trial's thread", before), ("now: in a thread, during evaluate", now))
    print("\n" + table(("digest", "trials", "median trial wall s (least-most)", "median seconds the digest held a trial"),
                       [(name, len(side["wall"]), "{:.2f} ({:.2f}-{:.2f})".format(*spread(side["wall"])),
                         f"{spread(side['digest'])[0]:.3f}") for name, side in sides]))
    added = spread(now["digest"])[0]
    print(f"\nThe digest now adds {added:.3f} s a trial (target at most {TARGET} s: "
          f"{'met' if added <= TARGET else 'NOT met'}); the median wall time went from "
          f"{spread(before['wall'])[0]:.2f} to {spread(now['wall'])[0]:.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
