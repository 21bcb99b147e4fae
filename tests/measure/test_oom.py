"""Why a probe ran out of memory (catsdogs.measure.oom): the allocator's words read from each
framework's error and the device's counters at the failure, and the cause in one line. The texts
are the frameworks' own (XLA's allocator, TensorFlow's BFC, XLA's autotuner: ../shared/GPU.md).
Pure: nothing runs on a device here."""

from __future__ import annotations

import pytest

from catsdogs.measure import oom
from catsdogs.measure.find_summary import probe_line
from catsdogs.messages import ProbeRecord

GIB = 2**30
XLA = "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {} bytes."
H200 = {"bytes_limit": 107 * GIB, "peak_bytes_in_use": 60 * GIB}  # XLA's pool on the H200 (75% of 143 GiB)


def test_a_request_beyond_what_the_pool_has_free_is_said_so():
    # given XLA asking for 12 GiB with 100 of its 107 GiB in use
    words = oom.allocator_words(XLA.format(12 * GIB), {**H200, "bytes_in_use": 100 * GIB})
    # then the bytes asked are read, and the cause is the pool
    assert words["bytes_asked"] == 12 * GIB and words["elements_asked"] is None
    assert oom.cause(XLA.format(12 * GIB), words) == "beyond the pool: 12.00 GiB asked, 7.00 GiB free of 107.00 GiB"


def test_free_bytes_in_no_block_large_enough_is_fragmentation():
    # given 47 GiB free but no free block above 10 GiB, and 12 GiB asked
    stats = {**H200, "bytes_in_use": 60 * GIB, "largest_free_block_bytes": 10 * GIB}
    words = oom.allocator_words(XLA.format(12 * GIB), stats)
    # then it is said to be fragmentation, with the largest block
    assert oom.cause(XLA.format(12 * GIB), words).startswith("fragmentation: 12.00 GiB asked, 47.00 GiB free but the "
                                                             "largest free block 10.00 GiB")


def test_a_request_that_fits_the_pool_as_counted_says_the_failure_lies_outside_it():
    stats = {**H200, "bytes_in_use": 60 * GIB, "largest_free_block_bytes": 40 * GIB}
    said = oom.cause(XLA.format(12 * GIB), oom.allocator_words(XLA.format(12 * GIB), stats))
    assert said.endswith("what failed lies outside the pool as counted")


def test_xlas_other_wording_and_tensorflows_shape_are_read_and_only_a_named_tensor_is_held_to_cudnns_limit():
    # given XLA's "Failed to allocate request for" and TensorFlow's BFC naming a tensor's shape
    xla = "RESOURCE_EXHAUSTED: Failed to allocate request for 12.00GiB (12884901888B) on device ordinal 0"
    assert oom.allocator_words(xla, {})["bytes_asked"] == 12884901888
    tf = ("ResourceExhaustedError: OOM when allocating tensor with shape[1800,32,198,198] and type float on "
          "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    words = oom.allocator_words(tf, {})
    # then the tensor's elements are its shape's (2.26e9: past 2^31) and its bytes at float's 4
    assert words["elements_asked"] == 1800 * 32 * 198 * 198 and words["bytes_asked"] == 4 * words["elements_asked"]
    assert oom.cause(tf, words).startswith("one tensor of 2,258,150,400 elements, past cuDNN's 2^31")
    # and a buffer XLA asks for, however large, is not taken for one tensor
    assert "cuDNN" not in (oom.cause(XLA.format(12 * GIB), oom.allocator_words(XLA.format(12 * GIB), {})) or "")


def test_the_autotuners_failure_and_a_cpus_kill_are_told_apart():
    autotune = "JaxRuntimeError: NOT_FOUND: Failed to get configs for: 2 out of 26 instructions."
    assert oom.cause(autotune, oom.allocator_words(autotune, H200)).startswith("XLA's autotuner found no kernel")
    # a CPU's out-of-memory is the cap's kill: no words, no cause
    assert oom.cause("killed at the cap", oom.allocator_words("killed at the cap", None)) is None


@pytest.mark.parametrize("stats", [None, {"bytes_in_use": 60 * GIB, "bytes_limit": 107 * GIB, "largest_free_block_bytes": 5 * GIB}])
def test_an_out_of_memory_probes_record_and_line_carry_the_words_and_the_cause(stats):
    # given a probe out of memory with XLA's words and the counters the worker kept (or none)
    record = ProbeRecord(batch_size=1888, status="oom", phase="search", error=XLA.format(12 * GIB),
                         allocator_stats=stats)
    # when described
    oom.describe(record)
    # then its view holds the MiB asked (and the counters where kept), and its line says the cause
    assert record.oom_asked_mb == 12 * 1024
    view = record.view("search")
    assert {"oom_asked_mb", "oom_largest_free_mb", "oom_in_use_mb", "oom_cause"} <= set(view)
    if stats:
        assert view["oom_largest_free_mb"] == 5 * 1024 and "fragmentation" in probe_line(record)
    else:
        assert view["oom_in_use_mb"] is None and probe_line(record).endswith("12.00 GiB asked")


def test_the_worker_keeps_the_allocators_numeric_counters_and_none_where_it_keeps_none():
    from types import SimpleNamespace

    from catsdogs.training.probes import _allocator_stats

    gpu = SimpleNamespace(device_stats=lambda: {"bytes_in_use": 5, "largest_free_block_bytes": 7.0, "name": "x",
                                                 "flag": True})
    assert _allocator_stats(gpu) == {"bytes_in_use": 5, "largest_free_block_bytes": 7}
    assert _allocator_stats(SimpleNamespace(device_stats=lambda: {})) is None  # JAX on a CPU
    assert _allocator_stats(SimpleNamespace()) is None  # TensorFlow


def test_xlas_sizes_in_units_are_read_as_jax_0_11_words_them_on_the_h200():
    # given the text the H200's out-of-memory probe gave (2026-11-28), and each unit XLA may use
    said = ("JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 44.86GiB with "
            "allocator GPU_0_bfc on device 0. [tf-allocator-allocation-error=''] [executable_name='jit_train_step']")
    # then the bytes asked are 44.86 GiB (0.29.0 read none), and 512.0MiB and 1234B alike
    assert oom.allocator_words(said, {})["bytes_asked"] == round(44.86 * GIB)
    assert oom.allocator_words("trying to allocate 512.0MiB with", {})["bytes_asked"] == 512 * 2**20
    assert oom.allocator_words("trying to allocate 1234B with", {})["bytes_asked"] == 1234
