"""What profile and find-batch-size share: their probe settings checked and shown, memory sizes
read and written as people write them, and their CSV files; and a run's claim on its folder
(find-batch-size's OUT/NAME/.running).

Framework-free, as both commands' own processes are (their probes run in workers).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from pathlib import Path

from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.files import atomic_path
from catsdogs.host import gpu_total_bytes, host_memory_bytes, process_alive, visible_gpus
from catsdogs.schema import TrialConfig, check_at_most, process_words
from catsdogs.training.costs import state_bytes

# --- memory sizes --------------------------------------------------------------------------------

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # bare K/M/G/T: binary, as docker and ulimit


def parse_memory(text: str) -> int:
    """'4GiB' -> 4294967296, '1.5 GB' -> 1500000000, '512MiB', '800M' (binary). Whole bytes.

    A unit is required (a bare '4' is surely not four bytes); a SettingError with a one-line reason."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m:
        raise SettingError(f"not a memory size: {text!r} (use a number and a unit, like 4GiB or 512MB)", "memory_limit")
    number, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        raise SettingError(f"{text!r} has no unit: write it like 4GiB, 4096MiB or 4GB", "memory_limit")
    if unit not in _UNITS:
        raise SettingError(f"unknown unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB", "memory_limit")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise SettingError(f"a memory size must be positive, got {text!r}", "memory_limit")
    return value


def check_memory_limit(value: int) -> int:
    """A memory cap no larger than the machine's memory (its RAM, or its GPU's where NVML says and
    it is larger): a larger one caps nothing, and lets probes take the machine down. A
    SettingError naming the machine's memory otherwise."""
    ram, gpu = host_memory_bytes(), gpu_total_bytes()
    if gpu is None and visible_gpus():
        return value  # a GPU whose size NVML cannot tell (no nvml extra): nothing to hold it to
    most = max(ram or 0, gpu or 0)
    if most and value > most:
        names = f"{format_bytes(ram)} of RAM" + (f", {format_bytes(gpu)} on its GPU" if gpu else "")
        raise SettingError(f"{format_bytes(value)} is more than this machine's memory ({names}): a cap that "
                           "large caps nothing", "memory_limit")
    return value


def check_memory_floor(cap_bytes: int | None, image_size: int, optimizer: str, precision: str) -> None:
    """A SettingError when a memory cap is below what batch size 1 needs: the model's weights, their
    gradients and the optimizer's slots alone (catsdogs.training.costs), whatever the batch."""
    if cap_bytes is None:
        return
    floor = sum(state_bytes(image_size, optimizer, precision).values())
    if cap_bytes < floor:
        raise SettingError(f"{format_bytes(cap_bytes)} is below what batch size 1 needs at {image_size} px: the "
                           f"model's weights, gradients and {optimizer}'s slots alone take {format_bytes(floor)}",
                           "memory_limit")


def first_line(text) -> str:
    """An error's first line, or "no reason given"."""
    return next(iter(str(text or "").splitlines()), "") or "no reason given"


def format_bytes(n: float) -> str:
    """1.5 GiB, 300 MiB: binary units, as the caps are given."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if not 100 <= n / scale < 1e6 else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


# --- a probe's settings --------------------------------------------------------------------------


def settings_note(deterministic: bool, tf32: bool | None) -> str:
    """"; non-deterministic, TF32 off": the workers' settings that are not defaults, for a log line."""
    words = process_words(deterministic, tf32)
    return "; " + ", ".join(words) if words else ""


def check_settings(batch_sizes: Sequence[int], optimizer: str, dataset: str, precision: str,
                   steps: int, warmup: int) -> None:
    """A SettingError, naming the setting, for one no probe can run with: each batch size with the
    optimizer, data set and precision must make a trial (schema.TrialConfig.check)."""
    if not batch_sizes:
        raise SettingError("give at least one batch size", "batch_size")
    for b in batch_sizes:
        TrialConfig(optimizer, int(b), dataset, 0, precision=precision).check()
    if steps < 1:
        raise SettingError(f"steps must be >= 1, got {steps}", "steps")
    if warmup < 0:
        raise SettingError(f"warm-up steps must be >= 0, got {warmup}", "warmup")
    check_at_most(steps, "steps")
    check_at_most(warmup, "warmup")


# --- CSV -----------------------------------------------------------------------------------------


def write_csv(rows: list[dict], path: Path, columns: Sequence[str]) -> Path:
    """`rows` as a CSV of `columns` (floats to 6 significant digits, None empty), written atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k)) for k in columns})
    return path


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


# --- a run's claim on its folder -----------------------------------------------------------------


def take_claim(lock: Path, shared=None) -> None:
    """This run's claim on its folder (a file of its pid); a CatsdogsError where another live run
    holds it, whose answer this one's would overwrite (a claim whose process is gone is taken).
    `shared`: a worker of the run's (a user's model's check), closed where the claim fails."""
    for _ in range(2):
        try:
            with open(lock, "x") as f:
                f.write(str(os.getpid()))
            return
        except FileExistsError:
            holder = claim_of(lock)
            why = (None if holder is not None and (holder == os.getpid() or not process_alive(holder)) else
                   f"another find-batch-size (pid {holder}) is writing {lock.parent}: wait for it to end, or give "
                   "this run another --name" if holder is not None else
                   f"{lock} is not a claim of catsdogs's (a pid): remove it, or give this run another --name")
            if why:
                if shared:
                    shared.close()
                raise CatsdogsError(why) from None
            lock.unlink(missing_ok=True)  # its run is gone (killed): its claim with it
    raise CatsdogsError(f"cannot claim {lock.parent}: another run keeps claiming it")


def claim_of(lock: Path) -> int | None:
    """The pid a claim holds; None for what no run of catsdogs wrote (a folder, a link, other bytes)."""
    if lock.is_symlink() or not lock.is_file():
        return None
    try:
        text = lock.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) <= 10 else None
