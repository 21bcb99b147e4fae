"""The memory search: the largest batch size that fits, and the margin taken off it. Pure
functions, no framework, no process. What to train with is catsdogs.recommendation's to decide;
find-batch-size's options, catsdogs.measure.settings'.

The search (`search`) takes any probe function, so it is tested with a fake device:
- `power`: double from `start` until a probe does not fit (or `max` is reached; `max` itself is
  probed when the doubling would pass it, or come within a quarter below it: `next_size`). If
  `start` does not fit, halve instead, down to 1. find-batch-size's `max` is the training split
  unless --max says otherwise: no larger batch can be trained on the data.
- `binsearch`: `power`, then bisect between the last size that fit and the first that did
  not, until the gap is at most `resolution`; by default 3% of the size that fits (`share`;
  find-batch-size's on the CPU, whose peak is a resident set, 5%), at least 8, and at most an
  eighth of it (so 4 still bisects towards 7): memory varies from run to run, so a finer answer
  would be noise, and the answer with a margin is rounded to a multiple of 8 anyway.
- `binsearch` with a prediction (`guess`, the memory model's): the doubling stops where the next size would
  pass FRESH_SHARE of it: the probes from there on each start a worker of their own (seconds
  each, against a fraction of a second for a reused one), so the search probes the prediction,
  then gallops to its other side in steps of 5%, 10%, 15%, 20% ... of it above, 5%, 10%, 20% ...
  below (`around_guess`), and bisects what is left. Doubling on from 512 to 1,024 and bisecting
  back would cost a probe or two more.
- `binsearch` with a `ceiling` (JAX on a GPU, whose probes share a worker's pool): an out-of-memory
  probe's words (the bytes asked, the largest free block, the pool's regions) bound what can still
  fit in that pool (catsdogs.measure.gpu_pool); no size above the bound is probed, and the
  bisection ends where the bound lies within its gap of the size that fits.
- A probe that fails for another reason than memory does not stop the search: while doubling
  the search steps over it (two failed sizes in a row end the doubling), and while bisecting
  it counts as an upper bound, so the answer is always a size that actually ran.

The margin (`apply_margin`): `margin` (e.g. 0.1) takes that fraction off the largest size that
fits, then rounds down to a multiple of 8 (GPU kernels and tensor cores like multiples of 8), or
to a power of two below 8. The critical batch size is rounded down the same way (`round_batch`)
and probed when it lies below the margin's size (`critical_probe`), so that the recommendation
has a probe at the statistics' limit. A confirmation that fails moves the margin's size down
until one passes (`confirm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from catsdogs import goodput
from catsdogs.errors import SettingError
from catsdogs.goodput import round_batch  # the margin's grid, which the decision's gaps share
from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.schema import Status

MODES = ("power", "binsearch")
DEFAULT_START = 8
DEFAULT_STEPS = 3  # timed steps per probe, after one warm-up step: the peak comes in the first
DEFAULT_WARMUP = 1
# A probe's steps timed for at least this long: 3 steps of a small batch last tens of milliseconds on
# a CPU, and their median moved by 15% from run to run, enough to reorder the predicted times to a
# target of neighbouring sizes. A large batch's 3 steps last longer than this anyway.
DEFAULT_MIN_SECONDS = 0.3
DEFAULT_MARGIN = 0.1
DEFAULT_RESOLUTION = 8  # the bisection's final gap at least (an eighth of the answer when smaller)
# ... and at most this share of the answer: each probe near the limit costs a fresh worker
# (seconds), and peak memory moves by a few MiB from run to run, so bisecting 800 down to 8
# rather than 24 spends two probes on noise; the margin's 10% and rounding to 8 come after.
RESOLUTION_SHARE = 0.03
# ... on the CPU, where a probe's peak is its resident set: 5%. At 64 px under 2 GiB on TensorFlow
# one size's peak moved by 40 MiB between two runs (768: 2,033 then 1,951 MiB; 786: 2,018, then
# 2,051 and out of memory), 28 images, 3.6% of the size: a 3% bracket there bisects that noise.
RSS_RESOLUTION_SHARE = 0.05
MAX_FAILED_IN_A_ROW = 2
MAX_CONFIRMATIONS = 4  # sizes tried down from the margin's before giving up (each one probe)
FRESH_SHARE = 0.8  # probes at or above this share of the predicted limit run in a fresh worker
GUESS_STEP = 0.05  # after the predicted limit, the gallop's first step to its other side (then 10%, 20% ...)
# Above the guess the gallop goes 5%, 10%, then 15% before 20%: TensorFlow's prediction on the CPU
# came out 0 to 10% low (731 against measured limits of 731, 768, 786 and 805), and a limit
# between +10% and +15% (805) then costs the probe of +15% where +20% and the bisection back cost
# two, for the same bracket. Past the last step (a prediction more than 80% low): doubling.
GALLOP_UP = (0.05, 0.10, 0.15, 0.20, 0.40, 0.80)
NEAR_MAX = 0.75  # the doubling goes straight to --max (or the data's bound) from this share of it up


@dataclass
class SearchResult:
    largest_fit: int | None  # the largest size that fit (None: not even 1)
    first_failure: int | None  # the smallest size above it that did not (None: never failed)
    order: list[int] = field(default_factory=list)  # batch sizes in the order probed
    statuses: dict[int, str] = field(default_factory=dict)
    reached_max: bool = False  # the search stopped at `max` with everything fitting
    ceiling: int | None = None  # where the allocator's words ended the bisection: no larger size can fit


def effective_resolution(resolution: int | None, largest_fit: int, share: float = RESOLUTION_SHARE) -> int:
    """The gap the bisection stops at: `resolution` when given; by default `share` of the size
    that fits, at least DEFAULT_RESOLUTION, and at most an eighth of it (at least 1)."""
    if resolution is not None:
        return int(resolution)
    relative = max(DEFAULT_RESOLUTION, math.ceil(share * largest_fit))
    return max(1, min(relative, largest_fit // 8))


def search(probe: Callable[[int], str], mode: str = "binsearch", start: int = DEFAULT_START,
           max_batch: int | None = None, resolution: int | None = None,
           guess: int | Callable[[], int | None] | None = None, share: float = RESOLUTION_SHARE,
           ceiling: Callable[[], int | None] | None = None, known: tuple[int, ...] = ()) -> SearchResult:
    """Find the largest batch size for which `probe(batch_size)` says done (it fits).

    `probe` returns a status, done (fits), oom or failed, and is called at most once per batch size.
    `guess` (the memory model's prediction, or a function that gives it as it stands after the
    probes so far) ends the doubling where the next size would pass FRESH_SHARE of it: the guess
    is probed, then GUESS_STEP to its other side (`around_guess`). `ceiling` gives, once a size has
    failed, the largest that can still fit by the allocator's own words (probe_run.ProbeRun.ceiling),
    or None: the bisection probes no size above it, and stops where it lies within the gap.
    `known`: sizes `probe` has run already (memory_prediction.check_replay's), answered at no cost,
    taken where the doubling ends (`from_known`): the gallop starts from them or bisects up to them."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if start < 1 or (max_batch is not None and max_batch < 1) or (resolution is not None and resolution < 1):
        raise ValueError("start, max and resolution must be >= 1")
    res = SearchResult(None, None)

    def ask(b: int) -> str:
        if b not in res.statuses:
            res.order.append(b)
            res.statuses[b] = probe(b)
        return res.statuses[b]

    b = min(start, max_batch) if max_batch is not None else start
    lo = hi = None
    if ask(b) == Status.DONE:
        lo = b
    else:  # the start is too large: halve until something fits
        hi = b
        while b > 1:
            b //= 2
            if ask(b) == Status.DONE:
                lo = b
                break
            hi = b
    if lo is None:
        return res
    if hi is None:  # double until out of memory, `max`, or failures in a row
        b, failed_run = lo, []
        guided = guess is None  # the guess tried (or none given)
        current = guess if callable(guess) else (lambda: guess)
        while max_batch is None or b < max_batch:
            aim = None if guided else current()
            if aim is not None and near_aim(b, aim):
                guided = True
                lo, hi = from_known(ask, lo, known)
                if hi is not None:  # no guess above a size that ran out of memory: bisect up to it
                    break
                lo, hi = around_guess(ask, lo, aim, max_batch)
                if failed_run and failed_run[0] < lo:  # a size failed below one that fitted: stepped over
                    failed_run = []
                elif failed_run and hi is not None:  # as when doubling: the first failed size bounds it
                    hi = min(hi, failed_run[0])
                if hi is not None:
                    break
                b = lo  # both fitted: the prediction was low, so double on from there
                continue
            b = next_size(b, max_batch)
            status = ask(b)
            if status == Status.DONE:
                lo, failed_run = b, []
            elif status == Status.OOM:
                hi = failed_run[0] if failed_run else b
                break
            else:
                failed_run.append(b)
                if len(failed_run) >= MAX_FAILED_IN_A_ROW:
                    hi = failed_run[0]
                    break
        else:
            res.reached_max = not failed_run
            if failed_run:
                hi = failed_run[0]
    if mode == "binsearch" and hi is not None:
        lo, hi, res.ceiling = bisect(ask, lo, hi, lambda fit: effective_resolution(resolution, fit, share), ceiling)
    res.largest_fit, res.first_failure = lo, hi
    return res


def bisect(ask: Callable[[int], str], lo: int, hi: int, gap: Callable[[int], int],
           ceiling: Callable[[], int | None] | None = None) -> tuple[int, int, int | None]:
    """Bisect between `lo` (fits) and `hi` (does not) until they are at most `gap(lo)` apart, never
    probing above the `ceiling` where one is known: (lo, hi, the ceiling where it ended the bisection)."""
    while hi - lo > gap(lo):
        top = ceiling() if ceiling is not None else None
        if top is not None and top < lo:  # a size above it fitted: the words were off, the probes decide
            top = None
        if top is not None and top - lo <= gap(lo):  # nothing above `lo` by more than the gap can fit
            return lo, hi, top
        mid = (lo + hi) // 2 if top is None else min((lo + hi) // 2, top)
        if ask(mid) == Status.DONE:
            lo = mid
        else:
            hi = mid
    return lo, hi, None


def from_known(ask: Callable[[int], str], lo: int, known: tuple[int, ...]) -> tuple[int, int | None]:
    """Where the doubling ends at `lo`, the sizes probed before the search (`known`) above it: (the
    largest that fitted below the least that ran out of memory, that least or None)."""
    above = {k: ask(k) for k in sorted(known) if k > lo}
    failed = [k for k, status in above.items() if status == Status.OOM]
    hi = failed[0] if failed else None
    return max([lo] + [k for k, status in above.items() if status == Status.DONE and (hi is None or k < hi)]), hi


def near_aim(b: int, aim: int) -> bool:
    """Whether the doubling ends at `b`, aiming at `aim` (the memory model's prediction): its next
    size would reach FRESH_SHARE of it, where the probes run in fresh workers."""
    return b * 2 >= FRESH_SHARE * aim


def last_doubling_size(start: int, max_batch: int | None, aim: int) -> int | None:
    """The largest size the doubling probes before it aims at `aim` (as `search` runs it, every
    size fitting), in [0.4, 0.8) of `aim`; None where the doubling never gets below FRESH_SHARE of
    it (a start there) or reaches `max_batch` first."""
    b = min(start, max_batch) if max_batch is not None else start
    while not near_aim(b, aim):
        if max_batch is not None and b >= max_batch:
            return None
        b = next_size(b, max_batch)
    return b if b < FRESH_SHARE * aim and (max_batch is None or b < max_batch) else None


def next_size(b: int, max_batch: int | None) -> int:
    """The doubling's next size: twice `b`, or `max_batch` where twice `b` would pass it or come
    within NEAR_MAX of it (the bound is probed anyway, and a size that close to it says little
    more, at the price of a compilation of its own)."""
    if max_batch is None:
        return 2 * b
    return max_batch if 2 * b >= NEAR_MAX * max_batch else 2 * b


def around_guess(ask: Callable[[int], str], lo: int, guess: int, max_batch: int | None) -> tuple[int, int | None]:
    """Probe the guess, then gallop from it, above it while sizes fit (GALLOP_UP's steps: 5%,
    10%, 15%, 20%, 40%, 80% of it, then doubling), below it while they do not (GUESS_STEP, then
    twice, four times ... as much: 5%, 10%, 20%, 40%, 80%, stopping at `lo`, the last size the
    doubling saw fit; the first step down is to the guess over 1 + GUESS_STEP): (the largest size
    that fitted, the smallest above it that did not, or None when all fitted up to `max_batch`).
    A prediction within GUESS_STEP leaves a bracket of GUESS_STEP of the size that fits to bisect;
    one 9% low a bracket of 5%, between +5% and +10%, where doubling on from the guess and
    bisecting back took five fresh probes more. A prediction off by half or more costs a few
    probes more than none would."""
    g = min(guess, max_batch) if max_batch is not None else guess
    if g <= lo:
        return lo, None
    step = GUESS_STEP
    if ask(g) != Status.DONE:
        hi = g
        # the first step down leaves the guess GUESS_STEP above it, as a fit at the guess and a
        # failure GUESS_STEP above it do: a bracket within the bisection's 5% of the size that
        # fits on a resident set. 5% of the guess below it was not, by a hair, and the fresh probe
        # more that cost (JAX's prediction runs 0-5% high on the CPU) bisected 25 images at 64 px,
        # within a resident set's noise
        down = min(math.ceil(g / (1 + step)), g - 1)
        while True:
            if down <= lo:
                return lo, hi
            if ask(down) == Status.DONE:
                return down, hi
            hi, step = down, step * 2
            down = math.floor(g * (1 - step))
    fit, steps = g, iter(GALLOP_UP)
    while max_batch is None or fit < max_batch:
        up_step = next(steps, None)  # past the last step it was far off: double, as without a guess
        up = max(fit + 1, math.ceil(g * (1 + up_step)) if up_step is not None else 2 * fit)
        if max_batch is not None:
            up = min(up, max_batch)
        if ask(up) != Status.DONE:
            return fit, up
        fit = up
    return fit, None


def apply_margin(largest: int, margin: float) -> int:
    """`largest` less the fraction `margin`, rounded down to a multiple of 8 (a power of two
    below 8). margin 0 returns `largest` itself, unrounded; never less than 1."""
    if not 0 <= margin < 1:
        raise SettingError(f"margin must be in [0, 1), got {margin}", "margin")
    if largest < 1:
        raise ValueError(f"nothing to take a margin off: {largest}")
    if margin == 0:
        return largest
    target = math.floor(largest * (1 - margin) + 1e-9)
    if target >= 8:
        return target // 8 * 8
    return 2 ** int(math.log2(target)) if target >= 1 else 1


def critical_probe(estimate: NoiseEstimate | None, safe: int | None) -> int | None:
    """The batch size to probe at the critical batch size (rounded down): the noise scale's
    estimate, or its lower end where it is only a bound (goodput.interval: without even that the
    recommendation is speed's and has no use for it), below the memory limit's size (`safe`;
    None: not known yet, any size); None otherwise."""
    if goodput.interval(estimate) is None or not estimate.value:
        return None
    size = round_batch(estimate.value)
    return size if safe is None or size < safe else None


def confirm(probe: Callable[[int], str], safe: int, most: int = MAX_CONFIRMATIONS) -> tuple[int | None, list[int]]:
    """Probe the margin's size; while it does not pass, the next size down on the margin's grid (a
    multiple of 8, a power of two below 8), at most `most` probes: peak memory is not monotonic in
    the batch size (TensorFlow's CPU path), so a size below one that fitted can still fail. Returns
    (the first size that passed, or None; the sizes that failed, in order)."""
    failed: list[int] = []
    size = safe
    while len(failed) < most:
        if probe(size) == Status.DONE:
            return size, failed
        failed.append(size)
        if size <= 1:
            break
        size = round_batch(size - 1)
    return None, failed


def fresh_threshold(predicted_max: int) -> int:
    """The smallest batch size that gets a fresh worker, given the predicted largest that fits."""
    return max(1, math.ceil(FRESH_SHARE * predicted_max))


def percent_apart(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured
