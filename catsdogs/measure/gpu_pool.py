"""XLA's GPU memory pool, grown region by region: the largest buffer a worker can still get, and so
the largest batch size it can train where the pool binds before the device does (issue 63). Pure
arithmetic; no framework.

With preallocation off (XLA_PYTHON_CLIENT_PREALLOCATE=false, which every catsdogs worker sets:
catsdogs.runtime.backends.jax_process) XLA's GPU allocator is TSL's BFCAllocator with growth
(xla/pjrt/gpu/gpu_helpers.cc). Its pool grows by regions (`BFCAllocator::Extend`): the first of
2 MiB, each next one twice the last, the last whatever the cap leaves; a request larger than the
next size takes the first size of the series above it, and the region after repeats that size.
`grown_regions` is the plain series, what a worker whose requests climb by doubling grows (the
search's way up), not a pool grown by a jump. A buffer lies within one region; regions are never merged, and with
garbage collection off (XLA's default) never given back. A worker whose probes climbed from batch
size 1 by doubling has grown its pool in that series: under the H200's cap (107,368 MiB) regions of
2, 4, ... 32,768 MiB (65,534 MiB in all) and a last one of 41,834. A training step whose temporary
buffer is larger than that cannot run in the worker however much of the pool is free.

Measured (docs/gpu.md, 2026-11-28): at 2,048, 1,920 and 1,888 XLA asked for one buffer of 22.43 MiB
an image while its largest free block was 41,830 MiB with 1.2 GiB in use; 1,856 fitted, on both
H200 runs. XLA's plan (22.54 MiB an image) into the series' largest region gives 1,855
(`predict_in_pool`); the plan into the whole cap gave 4,726, the limit of a pool that is one region
(preallocation on). What a fresh process fits, its pool grown from its own first requests, lies
between 2,048 (0.15.0: fitted in a worker that had run only sizes 1 and 2, its 45,937 MiB buffer in
a region of 65,536) and 4,333 (out of memory in a fresh worker), not measured.
"""

from __future__ import annotations

from catsdogs.measure import oom
from catsdogs.runtime.backends.jax_process import process_env

REGION_START_BYTES = 2 * 2**20  # BFCAllocator's first region with growth: min(the memory, 2 MiB)
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def grows(env) -> bool:
    """Whether a worker started with `env` grows its pool (preallocation off): a JAX worker takes
    the user's PREALLOCATE, else catsdogs' own (jax_process.process_env, set with setdefault); a
    user's true (JAX's own default) makes the pool one region of the whole cap."""
    return str(env.get(PREALLOCATE, process_env()[PREALLOCATE])).strip().lower() in ("false", "0")


def grown_regions(cap_bytes: float, start: int = REGION_START_BYTES) -> list[int]:
    """The regions of a pool grown to `cap_bytes` by doubling from `start`: each the next of the
    series while the cap leaves room for it, then what the cap leaves."""
    regions, size, total = [], start, 0
    while total + size <= cap_bytes:
        regions.append(size)
        total, size = total + size, size * 2
    if cap_bytes - total >= start:
        regions.append(int(cap_bytes - total))
    return regions


def predict_in_pool(pred: dict, cap_bytes: float) -> dict:
    """XLA's plan's prediction (costs.predict_max_batch_size_planned) held to the pool's largest
    region as well as to its cap: a step's buffer of the plan's bytes an image must fit in one
    region. The parts go under "pool"; `max_batch_size` becomes the lesser of the two."""
    regions = grown_regions(cap_bytes)
    largest = max(regions)
    in_region = int(largest // pred["per_image_bytes"])
    pool = {"regions": len(regions), "largest_region_bytes": largest, "region_start_bytes": REGION_START_BYTES,
            "max_batch_size": in_region, "plan_max_batch_size": pred["max_batch_size"]}
    return {**pred, "max_batch_size": min(pred["max_batch_size"], in_region), "pool": pool}


def ceiling(record) -> int | None:
    """After an out-of-memory in a worker that keeps its pool (JAX on a GPU recovers in place): the
    largest batch size whose buffer that pool can still give, at the failing request's bytes an
    image (bytes asked / its batch size), into the larger of its largest free block and what the
    cap leaves for a new region. None where the allocator's words do not tell it (pool_bytes
    among them), or where the pool could have given the request (then it failed elsewhere)."""
    words = oom.allocator_words(record.error, record.allocator_stats)
    asked, room = words["bytes_asked"], oom.pool_room(words)
    if asked is None or room is None or asked <= 0 or not record.batch_size or room >= asked:
        return None
    return int(room // (asked / record.batch_size))
