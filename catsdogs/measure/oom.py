"""Why a probe ran out of memory: the allocator's words, read from its error and from the device's
counters at the failure, and the cause in one line where they tell it (issue 63: on the H200 the
device's limit fell 62-155% below both predictions, yet the peaks measured stayed near 60 of the
107 GiB XLA may use: whatever fails is not the steady state the probes measure). Pure: the worker
hands in the error's text and the counters (training.probes.run_probe); no framework here.

The texts read (each framework's own words):
- XLA's allocator (JAX): "Out of memory while trying to allocate 44.86GiB with allocator
  GPU_0_bfc" (JAX 0.11 on the H200: two decimals, so within 5.12 MiB), "... allocate 12884901888
  bytes", or "Failed to allocate request for 12.00GiB (12884901888B) on device ordinal 0";
- TensorFlow's BFC: "OOM when allocating tensor with shape[256,32,198,198] and type float", whose
  bytes are the shape's elements times the type's size;
- XLA's autotuner, whose every candidate failed for want of scratch: "Failed to get configs" or
  "All configs failed during profiling" (../shared/GPU.md).

The causes said, in the order tried:
- **the autotuner**: no convolution kernel found within the scratch it could get, though the
  step's own buffers may fit (its scratch, up to TF_CUDNN_WORKSPACE_LIMIT_IN_MB, 4 GiB by default,
  comes from the same pool, and the plan does not count it);
- **one tensor past cuDNN's 2^31 elements** (a documented restriction; PyTorch #22496): only where
  the error names a tensor's shape (TensorFlow's); XLA asks for whole buffers (a step's temporary
  buffer holds many tensors), whose bytes say nothing of one tensor's elements;
- **beyond the pool**: the request is more than the pool has free (its limit less its bytes in use);
- **the pool's regions**: the request is above the largest free block and above what the cap
  leaves for a new region (`pool_bytes`, the regions grown so far): the pool has grown to its cap
  in regions that cannot be merged (catsdogs.measure.gpu_pool), however much of it is free;
- **fragmentation**: the pool has the bytes free, but not in one block (the request above its
  largest free block).
"""

from __future__ import annotations

import math
import re

CUDNN_ELEMENTS = 2**31  # cuDNN's limit on one tensor's elements
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
               "int32": 4, "int64": 8, "int8": 1, "uint8": 1, "bool": 1}
AUTOTUNER = ("Failed to get configs", "All configs failed during profiling")
_ASKED = (re.compile(r"allocate request for [^(]*\((\d+)B\)"), re.compile(r"rounded to (\d+)\)"),
          re.compile(r"trying to allocate ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)\b"))
_UNIT = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_TF_SHAPE = re.compile(r"shape\[([\d,]*)\] and type (\w+)")


def allocator_words(error: str | None, stats: dict | None) -> dict:
    """{"bytes_asked", "elements_asked" (a tensor's, where the error names its shape), "largest_free_block_bytes",
    "bytes_in_use", "bytes_limit", "pool_bytes"}: what the error and the device's counters (`stats`: XLA's
    memory_stats() at the failure; {} on the CPU) say, each None where they do not."""
    error, stats = error or "", stats or {}
    asked = elements = None
    for pattern in _ASKED:
        if (m := pattern.search(error)) is not None:
            unit = _UNIT[m.group(2)] if pattern.groups > 1 else 1
            asked = round(float(m.group(1)) * unit)
            break
    if (m := _TF_SHAPE.search(error)) is not None:
        dims = [int(d) for d in m.group(1).split(",") if d]
        elements = math.prod(dims) if dims else 1
        asked = asked or elements * DTYPE_BYTES.get(m.group(2), 4)
    def count(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if isinstance(value, (int, float)) and value >= 0 else None
    return {"bytes_asked": asked, "elements_asked": elements,
            "largest_free_block_bytes": count("largest_free_block_bytes"),
            "bytes_in_use": count("bytes_in_use"), "bytes_limit": count("bytes_limit"),
            "pool_bytes": count("pool_bytes")}


def cause(error: str | None, words: dict) -> str | None:
    """The cause of an out-of-memory in one line, where the error and the counters (`words`,
    `allocator_words`) tell it; None where they do not (a CPU's cap: the resident set's kill)."""
    error = error or ""
    if any(marker in error for marker in AUTOTUNER):
        return ("XLA's autotuner found no kernel within the scratch it could get (its scratch comes from the "
                "same pool and no plan counts it)")
    asked, elements = words.get("bytes_asked"), words.get("elements_asked")
    if elements is not None and elements >= CUDNN_ELEMENTS:
        return f"one tensor of {elements:,} elements, past cuDNN's 2^31 ({_gib(asked)} asked)"
    limit, used, largest = words.get("bytes_limit"), words.get("bytes_in_use"), words.get("largest_free_block_bytes")
    if asked is None or limit is None or used is None:
        return f"{_gib(asked)} asked" if asked is not None else None
    free = limit - used
    if asked > free:
        return f"beyond the pool: {_gib(asked)} asked, {_gib(free)} free of {_gib(limit)}"
    room, pool = pool_room(words), words.get("pool_bytes")
    if room is not None and asked > room:
        return (f"the pool's regions: {_gib(asked)} asked, {_gib(free)} free but the largest free block "
                f"{_gib(largest)}, and the pool grown in regions to {_gib(pool)} of its {_gib(limit)} "
                f"(preallocation off): no room for a larger one")
    if largest is not None and asked > largest:
        return (f"fragmentation: {_gib(asked)} asked, {_gib(free)} free but the largest free block "
                f"{_gib(largest)}")
    return (f"{_gib(asked)} asked and {_gib(free)} free of {_gib(limit)} (largest block {_gib(largest)}): what "
            f"failed lies outside the pool as counted")


def pool_room(words: dict) -> int | None:
    """The largest buffer the pool can still give (`allocator_words`): the larger of its largest
    free block and what its limit leaves for a new region; None where the counters do not say."""
    largest, limit, pool = words.get("largest_free_block_bytes"), words.get("bytes_limit"), words.get("pool_bytes")
    return None if None in (largest, limit, pool) else max(largest, limit - pool)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def describe(record) -> None:
    """An out-of-memory probe's record (messages.ProbeRecord) given what its allocator said: the
    bytes asked, the largest free block, the bytes in use and the pool's (MiB) and the cause,
    where known."""
    words = allocator_words(record.error, record.allocator_stats)
    mib = {k: None if v is None else round(v / 2**20, 1) for k, v in words.items()}
    record.oom_asked_mb, record.oom_largest_free_mb = mib["bytes_asked"], mib["largest_free_block_bytes"]
    record.oom_in_use_mb, record.oom_pool_mb = mib["bytes_in_use"], mib["pool_bytes"]
    record.oom_cause = cause(record.error, words)
