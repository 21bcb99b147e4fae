"""What the benchmarks share, in one place: running catsdogs as a user does and timing it, running
two (or more) sides in alternation (A B A B, so a busy machine weighs on each alike), a pair of
trials with and without an option in an order that alternates too, medians with their spread, and
the Markdown table every benchmark prints. Each benchmark keeps only what it measures.

This 2-core machine is shared and noisy: compare in one run, alternating, and quote medians and
ratios (docs/performance.md, "Benchmarks").
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # this checkout


def run_catsdogs(args: Sequence[str], checkout: Path = HERE, env: dict | None = None) -> float:
    """`python -m catsdogs ARGS` from `checkout` (its own catsdogs first on the path), as a user runs
    it; its wall time in seconds. Its output's end, and an exit, when it fails."""
    environ = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "catsdogs", *map(str, args)], capture_output=True, text=True,
                          env=environ, cwd=checkout)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{checkout}: catsdogs {' '.join(map(str, args[:2]))} failed (exit {proc.returncode})")
    return seconds


def run_snippet(code: str, args: Sequence[str], checkout: Path, backend: str, env: dict | None = None,
                what: str = "the snippet") -> object:
    """`python -c CODE ARGS` with `checkout`'s catsdogs first on the path and KERAS_BACKEND=`backend`
    (and `env`): the JSON its last line of output prints. Its errors' end, and an exit, when it fails."""
    environ = {**os.environ, "PYTHONPATH": str(checkout), "KERAS_BACKEND": backend, **(env or {})}
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=environ, capture_output=True,
                         text=True, cwd=checkout)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {what} failed on {backend}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def alternate_checkouts(sides: dict[str, Path], backend: str, run: Callable[[Path], object],
                        repeats: int) -> dict[str, list]:
    """`alternate` over checkouts on one backend: `run(checkout)` for each side in turn, each round
    logged with the backend's name."""
    return alternate({side: (lambda turn, c=checkout: run(c)) for side, checkout in sides.items()}, repeats,
                     log=lambda line: print(f"{backend}: {line.strip()}", flush=True))


def plan_file(checkout: Path, name: str) -> Path:
    """A built-in plan's file in a checkout: catsdogs/plans/ since 0.6.0, configs/ before."""
    new = checkout / "catsdogs" / "plans" / f"{name}.toml"
    return new if new.is_file() else checkout / "configs" / f"{name}.toml"


def alternate(sides: dict[str, Callable[[int], object]], repeats: int, log=print) -> dict[str, list]:
    """Each side's results over `repeats` rounds, the sides in turn within each round (A B A B):
    `sides[name](round)` runs one. Logs each as it ends."""
    results: dict[str, list] = {name: [] for name in sides}
    for r in range(repeats):
        for name, run in sides.items():
            started = time.perf_counter()
            results[name].append(run(r))
            log(f"  round {r + 1}: {name}: {time.perf_counter() - started:.1f} s")
    return results


def paired(run: Callable[[bool], object], turn: int) -> dict[bool, object]:
    """{False: run(False), True: run(True)}: a trial without and with what is measured, the one
    first on even turns and the other on odd ones, so neither always has the warmer machine."""
    order = (False, True) if turn % 2 == 0 else (True, False)
    return {flag: run(flag) for flag in order}


def trial_pair(slot, cfg, data_dir: Path, turn: int, **measured) -> dict[bool, object]:
    """{False: the trial without, True: with `measured` (a Slot.run option, e.g. noise_sampling=...)},
    run in `slot` as a sweep runs them (`paired` order); exits, saying why, unless both are done."""
    def run(on: bool):
        record = slot.run(cfg, data_dir, **(measured if on else {}))
        if record.status != "done":
            sys.exit(f"batch size {cfg.batch_size}, seed {cfg.seed}: {record.status}: {record.error}")
        return record
    return paired(run, turn)


def cpu_seconds(who=resource.RUSAGE_SELF) -> float:
    """This process's CPU seconds, user and system (RUSAGE_CHILDREN: those of the children it waited for)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, least, most)."""
    values = list(values)
    return statistics.median(values), min(values), max(values)


def median_of(rows: Iterable[dict], key: str | Callable[[dict], float]) -> float:
    """The median of one figure over rows: a key, or a function of the row."""
    get = key if callable(key) else (lambda r: r[key])
    return statistics.median(get(r) for r in rows)


def table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table, as docs/performance.md quotes them."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
