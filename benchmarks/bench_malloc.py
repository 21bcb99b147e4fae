"""glibc's malloc settings of a JAX worker on a CPU: each one's step time and peak, in fresh processes.

For each setting in turn (A B C A B C, `--rounds` rounds) a fresh process on the CPU (JAX_PLATFORMS=cpu,
whatever the host has) runs find-batch-size's
probe (catsdogs.training.probes.run_probe: a warm-up step, then `--steps` timed ones) at each
`--batch-size`, one process a size, and reports its median step and its peak resident memory.
Prints per setting and size the median step over the rounds, the median peak, the largest, and
how many processes peaked more than 15% above the median peak of glibc's defaults: a probe's
peak is what find-batch-size decides "fits" by, so a setting whose peak moves from one process to
the next moves the answer, and a training process may then need more than the probe said.

- `defaults`: glibc's own (no MALLOC_* variable, no tunable);
- `0.36.0`: one arena, no mmap, no trimming (MALLOC_ARENA_MAX=1, MALLOC_MMAP_MAX_=0,
  MALLOC_TRIM_THRESHOLD_=2^40), catsdogs's JAX workers' from 0.36.0 to 0.37.0;
- `hugetlb`: glibc's malloc.hugetlb tunable (transparent huge pages), catsdogs's since 0.38.0
  (catsdogs.runtime.backends.jax_process.MALLOC_ENV).

    python benchmarks/bench_malloc.py --data-dir /tmp/b/data --batch-size 256 800 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from harness import HERE, run_snippet, table

from catsdogs import host
from catsdogs.runtime.backends.jax_process import MALLOC_ENV  # (imports no framework)

SETTINGS = {
    "defaults": {},
    "0.36.0": {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)},
    "hugetlb": MALLOC_ENV,  # catsdogs's own
}
ABOVE = 1.15  # a peak this far above the defaults' median peak counts as one that moved

PROBE = """
import json, statistics, sys
from catsdogs.runtime import backends
backends.current().start()  # (before Keras imports JAX: the process's settings set first, as a worker's)
running = backends.current().running_settings()
from catsdogs.messages import ProbeTask
from catsdogs.training.probes import run_probe
data, size, steps, opt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = run_probe(ProbeTask(size, data, optimizer=opt, dataset="standard", precision="float32", steps=steps,
                        warmup=1, min_seconds=0.0, deterministic=running["deterministic"], tf32=running["tf32"]))
if r.status != "done":
    raise SystemExit(f"batch size {size}: {r.status}: {r.error}")
print(json.dumps({"step": statistics.median(r.step_times_s), "peak": r.peak_memory_mb}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (catsdogs prepare)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[256, 800], help="[256 800]")
    ap.add_argument("--steps", type=int, default=3, help="timed steps a probe, as find-batch-size's [3]")
    ap.add_argument("--opt", default="sgd", help="the optimizer [sgd]")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, the settings alternating [6]")
    args = ap.parse_args()
    if not (args.data_dir / "manifest.json").is_file():
        raise SystemExit(f"--data-dir {args.data_dir}: no prepared data there (catsdogs prepare)")
    for key in host.malloc_vars(os.environ):
        del os.environ[key]  # this shell's own: each side runs with its settings alone
    got = {(name, b): [] for name in SETTINGS for b in args.batch_size}
    for r in range(args.rounds):
        for name, env in SETTINGS.items():
            for b in args.batch_size:
                out = run_snippet(PROBE, [args.data_dir.resolve(), b, args.steps, args.opt], HERE, "jax",
                                  env={"JAX_PLATFORMS": "cpu", **env}, what=f"the probe of {b} ({name})")
                got[(name, b)].append(out)
                print(f"round {r + 1}: {name:8} {b:5}: step {out['step'] * 1000:7.1f} ms, peak {out['peak']:7.0f} MiB",
                      flush=True)
    rows = []
    for b in args.batch_size:
        base = statistics.median(o["peak"] for o in got[("defaults", b)])
        for name in SETTINGS:
            runs = got[(name, b)]
            peaks = [o["peak"] for o in runs]
            rows.append([b, name, f"{statistics.median(o['step'] for o in runs) * 1000:.1f}",
                         f"{statistics.median(peaks):.0f}", f"{max(peaks):.0f}",
                         f"{sum(p > ABOVE * base for p in peaks)} of {len(peaks)}"])
    print(f"\nJAX on the CPU, {args.opt}, {args.steps} timed steps a probe, {args.rounds} rounds, one process a probe\n")
    print(table(["batch size", "setting", "median step (ms)", "median peak (MiB)", "largest peak (MiB)",
                 f"peaks > {ABOVE:g}x the defaults' median"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
