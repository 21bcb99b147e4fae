"""XLA's GPU pool grown by regions (catsdogs.measure.gpu_pool), held to what the H200 said on
2026-11-28 (docs/gpu.md): at 2,048, 1,920 and 1,888 one buffer of 44.86, 42.06 and 41.36 GiB asked,
the largest free block 41,830 MiB, about 1.25 GiB in use, the cap 107,368 MiB; 1,856 fitted.
Pure arithmetic: nothing runs on a device here."""

from __future__ import annotations

import pytest

from catsdogs.measure import gpu_pool, oom
from catsdogs.messages import ProbeRecord

MiB, GiB = 2**20, 2**30
CAP = 107_368 * MiB  # XLA's 75% of the H200
ASKED = {2048: "44.86GiB", 1920: "42.06GiB", 1888: "41.36GiB"}  # as JAX 0.11 worded it
XLA = ("JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {} with allocator GPU_0_bfc "
       "on device 0. [tf-allocator-allocation-error=''] [executable_name='jit_train_step']")
STATS = {"bytes_limit": CAP, "bytes_in_use": 1_258 * MiB, "largest_free_block_bytes": 41_830 * MiB}
PLAN = {"max_batch_size": 4726, "per_image_bytes": 23_640_005.33, "method": "xla", "state_bytes": 491_541_966.7,
        "baseline_bytes": 353_441_288.0, "cap_bytes": CAP}  # XLA's plan as that run compiled it


def test_a_pool_grown_by_doubling_to_the_h200s_cap_ends_in_the_region_its_largest_free_block_measured():
    # given the H200's cap, and regions doubling from BFC's first 2 MiB
    regions = gpu_pool.grown_regions(CAP)
    # then they are 2, 4, ... 32,768 MiB and what the cap leaves: 41,834 MiB, 4 MiB above the 41,830 measured free
    assert regions[:-1] == [2 * MiB * 2**k for k in range(15)] and sum(regions) == CAP
    assert regions[-1] == 41_834 * MiB and max(regions) == regions[-1]


def test_an_h100s_cap_ends_the_series_at_16_gib_and_leaves_a_last_region_larger_than_it():
    # given an H100's 75% (61,169 MiB): 2 ... 16,384 MiB (32,766), then 28,403 left, the largest
    regions = gpu_pool.grown_regions(61_169 * MiB)
    assert regions[-2] == 16_384 * MiB and regions[-1] == 28_403 * MiB and sum(regions) == 61_169 * MiB
    assert max(regions) == regions[-1]
    # and a cap smaller than the first region is one region
    assert gpu_pool.grown_regions(MiB, start=2 * MiB) == []


def test_xlas_plan_into_the_largest_region_predicts_the_h200s_limit_and_keeps_the_plan_beside_it():
    # when the plan's 4,726 (the whole cap) is held to the pool's largest region
    pred = gpu_pool.predict_in_pool(PLAN, CAP)
    # then 1,855, within 0.1% of the 1,856 that fitted (1,888 did not), the plan's own figure kept
    assert pred["max_batch_size"] == 1855 and pred["pool"]["plan_max_batch_size"] == 4726
    assert pred["pool"]["largest_region_bytes"] == 41_834 * MiB and pred["pool"]["regions"] == 16
    assert pred["per_image_bytes"] == PLAN["per_image_bytes"] and pred["method"] == "xla"
    # and where the plan binds first (a smaller cap's region series is no tighter than its plan), it stays
    small = gpu_pool.predict_in_pool({**PLAN, "max_batch_size": 100}, CAP)
    assert small["max_batch_size"] == 100 and small["pool"]["max_batch_size"] == 1855


@pytest.mark.parametrize("batch", sorted(ASKED))
def test_each_recorded_failure_bounds_the_worker_at_the_largest_free_block_over_its_bytes_an_image(batch):
    # given the probe's words as the H200 gave them, the pool at its cap
    record = ProbeRecord(batch_size=batch, status="oom", error=XLA.format(ASKED[batch]),
                         allocator_stats={**STATS, "pool_bytes": CAP})
    # then no size above 1,864 can fit in that worker (41,830 MiB / 22.43 MiB an image): 1,856 fitted
    assert 1856 <= gpu_pool.ceiling(record) <= 1866
    # and the cause is said as the pool's regions
    oom.describe(record)
    assert record.oom_cause.startswith("the pool's regions: ") and record.oom_pool_mb == 107_368
    assert abs(record.oom_asked_mb - batch * 22.43) < 6  # two decimals of GiB: within 5 MiB


def test_no_bound_where_the_pool_could_grow_or_did_not_say_how_far_it_has():
    words = XLA.format("44.86GiB")
    # without pool_bytes (0.29.0 kept none) the words do not bound it, and the cause stays fragmentation
    unsaid = ProbeRecord(batch_size=2048, status="oom", error=words, allocator_stats=STATS)
    assert gpu_pool.ceiling(unsaid) is None
    assert oom.cause(words, oom.allocator_words(words, STATS)).startswith("fragmentation: 44.86 GiB asked")
    # with room left under the cap for a region larger than the request, the failure lies elsewhere
    roomy = ProbeRecord(batch_size=2048, status="oom", error=words,
                        allocator_stats={**STATS, "pool_bytes": 50_000 * MiB})
    assert gpu_pool.ceiling(roomy) is None


def test_the_ceiling_reads_only_the_out_of_memory_probes_of_the_worker_now_probing():
    from types import SimpleNamespace

    from catsdogs.measure.probe_run import ProbeRun

    # given a worker that ran out of memory at 2,048 in place, then died on a failure, and a fresh one
    oom_2048 = ProbeRecord(batch_size=2048, status="oom", worker="reused", error=XLA.format("44.86GiB"),
                           allocator_stats={**STATS, "pool_bytes": CAP})
    probes = [ProbeRecord(batch_size=1024, status="done", worker="fresh"), oom_2048,
              ProbeRecord(batch_size=1536, status="failed", worker="reused")]
    run = SimpleNamespace(prober=SimpleNamespace(in_place=True), probes=probes, ceiling_from=None)
    # then while the first worker probes, its failure bounds it
    assert 1856 <= ProbeRun.ceiling(run) <= 1866 and run.ceiling_from is oom_2048
    # and once a fresh worker (a pool of its own) has probed, the old words bound nothing
    probes.append(ProbeRecord(batch_size=1792, status="done", worker="fresh"))
    assert ProbeRun.ceiling(run) is None and run.ceiling_from is None
    # and where the probes do not share a worker's pool, never
    run.prober.in_place, run.probes = False, [oom_2048]
    assert ProbeRun.ceiling(run) is None


def test_a_pool_grows_unless_the_user_turned_preallocation_on():
    # catsdogs' workers set preallocation off unless the user set it: then the pool is grown
    assert gpu_pool.grows({}) and gpu_pool.grows({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert gpu_pool.grows({"XLA_PYTHON_CLIENT_PREALLOCATE": "0"})
    # and a user's true (JAX's own default) makes it one region: the plan alone binds
    assert not gpu_pool.grows({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"})
    assert not gpu_pool.grows({"XLA_PYTHON_CLIENT_PREALLOCATE": "1"})
