"""Benchmark whether find-batch-size's noise scale could train beside its memory search's probes on
this CPU, on what the probes leave idle: the probes alone, and the same probes while the noise
scale's short runs train at the idle priority (SCHED_IDLE) in a process of their own.

find-batch-size runs the two one after the other (catsdogs.measure.find_batch_size): the short
runs, then the probes. On two cores the probes keep 1.4 of them busy (their compilations and
Python are one thread's), so the short runs could take the rest, stopped while a probe's steps
are timed, if a process at the idle priority left the probes' speed alone. Each round, the two
sides in turn (A B, then B A):
- alone: the short runs (`measure_noise_scale`: the rate test's three runs of seed 0, then the
  three seeds left, three at once), then the probes (--sizes, one worker, as the prober runs the
  search's way up);
- beside: the same probes while the same short runs train in a process started at SCHED_IDLE
  (its workers inherit it), the probes begun --lead seconds after them.
Prints each side's short runs' wall time, each probe's wall time and median step time, the
probes' total and the whole (alone: the sum; beside: from the runs' start to the later end). The
probes' steps are not stopped beside the runs here: their step times show what a process at the
idle priority still takes from a step, their wall times what it takes from everything else.

    KERAS_BACKEND=jax python benchmarks/bench_beside.py --data-dir data/beyond
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, table

from catsdogs.manifest import require_prepared
from catsdogs.measure.prober import Prober
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import ProbeTask

SHORT_RUNS = """
import json, sys, time
from pathlib import Path
from catsdogs.manifest import require_prepared
from catsdogs.measure.noise_run import measure_noise_scale
from catsdogs.measure.settings import FindSettings
data, work = Path(sys.argv[1]), Path(sys.argv[2])
settings = FindSettings(name="beside", optimizer=sys.argv[3])
started = time.perf_counter()
run = measure_noise_scale(data, require_prepared(data), settings, work, settings.environment(), lambda line: None)
print(json.dumps({"seconds": time.perf_counter() - started, "b_simple": run.estimate.b_simple if run else None}))
"""


def idle_priority() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def start_short_runs(data_dir: Path, work: Path, optimizer: str, idle: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SHORT_RUNS, str(data_dir), str(work), optimizer],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(HERE)}, preexec_fn=idle_priority if idle else None)


def short_runs_seconds(proc: subprocess.Popen) -> float:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the short runs failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def probes(data_dir: Path, work: Path, sizes: list[int], optimizer: str) -> list[tuple[float, float]]:
    """(wall seconds, median step seconds) of each size's probe, in one worker, way up."""
    settings = FindSettings(name="beside", optimizer=optimizer)
    prober, out = Prober(work, 2 * 2**30, env=settings.environment()), []
    try:
        for b in sizes:
            started = time.perf_counter()
            record = prober.run(ProbeTask(b, str(data_dir), optimizer=optimizer, dataset="standard",
                                          precision="float32", steps=3, warmup=1, min_seconds=0.3))
            if record.status != "done":
                raise SystemExit(f"probe {b}: {record.status}: {record.error}")
            out.append((time.perf_counter() - started, record.step_time_median_s))
    finally:
        prober.close()
    return out


def one_side(side: str, data_dir: Path, sizes: list[int], optimizer: str, lead: float) -> dict:
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        runs = start_short_runs(data_dir, Path(work) / "runs", optimizer, idle=side == "beside")
        if side == "alone":
            noise = short_runs_seconds(runs)
            timed = probes(data_dir, Path(work) / "probes", sizes, optimizer)
        else:
            time.sleep(lead)
            timed = probes(data_dir, Path(work) / "probes", sizes, optimizer)
            noise = short_runs_seconds(runs)
        whole = time.perf_counter() - started
    print(f"  {side}: short runs {noise:.1f} s, probes {sum(w for w, _ in timed):.1f} s, whole {whole:.1f} s",
          flush=True)
    return {"noise": noise, "probes": timed, "whole": whole}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (catsdogs prepare)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256],
                    help="the probes' batch sizes, in one worker in this order")
    ap.add_argument("--opt", default="sgd", help="the optimizer (default sgd)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the sides alternating (default 2)")
    ap.add_argument("--lead", type=float, default=5.0, help="seconds the short runs start ahead (default 5)")
    args = ap.parse_args()
    data_dir = args.data_dir.resolve()
    require_prepared(data_dir)
    results: dict[str, list[dict]] = {"alone": [], "beside": []}
    for r in range(args.rounds):
        for side in (("alone", "beside") if r % 2 == 0 else ("beside", "alone")):
            print(f"round {r + 1}: {side}", flush=True)
            results[side].append(one_side(side, data_dir, args.sizes, args.opt, args.lead))
    med = {s: {"noise": statistics.median(x["noise"] for x in runs),
               "whole": statistics.median(x["whole"] for x in runs),
               "probes": statistics.median(sum(w for w, _ in x["probes"]) for x in runs),
               "wall": [statistics.median(x["probes"][i][0] for x in runs) for i in range(len(args.sizes))],
               "step": [statistics.median(x["probes"][i][1] for x in runs) for i in range(len(args.sizes))]}
           for s, runs in results.items()}
    a, b = med["alone"], med["beside"]
    rows = [[str(size), f"{a['wall'][i]:.2f}", f"{b['wall'][i]:.2f}", f"{b['wall'][i] / a['wall'][i]:.2f}",
             f"{a['step'][i] * 1e3:.0f}", f"{b['step'][i] * 1e3:.0f}", f"{b['step'][i] / a['step'][i]:.2f}"]
            for i, size in enumerate(args.sizes)]
    print(table(["batch", "wall alone s", "beside s", "ratio", "step alone ms", "beside ms", "ratio"], rows))
    print(f"medians over {args.rounds} rounds: short runs {a['noise']:.1f} s alone, {b['noise']:.1f} s beside; "
          f"probes {a['probes']:.1f} s alone, {b['probes']:.1f} s beside ({b['probes'] / a['probes']:.2f}x); "
          f"whole {a['whole']:.1f} s one after the other, {b['whole']:.1f} s beside ({b['whole'] / a['whole']:.2f}x)")


if __name__ == "__main__":
    main()
