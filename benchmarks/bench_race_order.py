"""Benchmark a race trial's time besides its training in the race's order, where the seed changes
at every trial: what keeping every seed's diagnosis of the model as it starts saves.

A race runs an arm at a time over its seeds (catsdogs.measure.race_run), so a worker that kept the
last seed's initial diagnosis alone (catsdogs 0.39.0, and 0.40.0's first commit) made it again at every trial: a
pass over the test set. This runs the race's kind of trial (SGD until val_loss 0.49 with the
curve every 256 images, `stop_at_chance`, at most 12 epochs) in one process, arm by arm over
`--seeds` seeds, with MOST_INITIAL diagnoses kept and with one kept (the old rule), A B A B, and
prints the median over trials of wall seconds less training seconds on each side, and whether every
trial reached the target at the same step on both (the diagnosis changes nothing it trains).

    python benchmarks/bench_race_order.py --data-dir /tmp/b/data
    KERAS_BACKEND=jax python benchmarks/bench_race_order.py --data-dir D --batch-size 16 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness import table

from catsdogs.manifest import load_manifest
from catsdogs.runtime import backends
from catsdogs.schema import TrialConfig
from catsdogs.training import diagnosis, engine


def race_order(args, data: dict) -> list[TrialConfig]:
    """The trials as a race's rung runs them: an arm (batch size, rate) at a time over the seeds."""
    return [TrialConfig("sgd", b, "standard", seed, epochs=12, image_size=data["params"]["size"],
                        data=data["fingerprint"]["standard"], lr=lr, until="val_loss=0.49", eval_every=256,
                        backend=backends.name(), stop_at_chance=True, **backends.current().running_settings())
            for b in args.batch_size for lr in args.lr for seed in range(args.seeds)]


def run(configs: list[TrialConfig], data_dir: Path, kept: int) -> list[dict]:
    diagnosis._INITIAL.clear()
    diagnosis.MOST_INITIAL = kept
    out = []
    for cfg in configs:
        r = engine.run_trial(cfg, data_dir)
        out.append({"besides": r.wall_seconds - r.train_seconds, "steps": r.steps_to_target})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (64 px)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[16], help="[16]")
    ap.add_argument("--lr", type=float, nargs="+", default=[0.025, 0.05], help="SGD's rates, an arm each [0.025 0.05]")
    ap.add_argument("--seeds", type=int, default=4, help="seeds an arm [4]")
    ap.add_argument("--repeats", type=int, default=2, help="runs a side, alternating [2]")
    args = ap.parse_args()
    backends.current().start()  # the process's settings, as a worker starts (catsdogs.training.child)
    configs = race_order(args, load_manifest(args.data_dir))
    kept = diagnosis.MOST_INITIAL
    run(configs[:1], args.data_dir, kept)  # the step compiled and the data decoded before either side
    found = {"kept": [], "one": []}
    for _ in range(args.repeats):
        for side, n in (("kept", kept), ("one", 1)):
            found[side].append(run(configs, args.data_dir, n))
    med = {s: statistics.median(t["besides"] for r in runs for t in r) for s, runs in found.items()}
    same = all(a["steps"] == b["steps"] for ra, rb in zip(found["kept"], found["one"], strict=True)
               for a, b in zip(ra, rb, strict=True))
    print(table(["backend", "trials a side", f"besides training, {kept} kept (s)", "one kept (s)", "ratio",
                 "the same steps to the target"],
                [[backends.name(), len(configs) * args.repeats, f"{med['kept']:.3f}", f"{med['one']:.3f}",
                  f"{med['kept'] / med['one']:.2f}", "yes" if same else "NO"]]))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
