"""Stage 3, measurement: the title question on this device, from probes of the sweep's own step.

    profile (throughput, memory, MFU, NVML against batch size) and find_batch_size (the largest
    batch that fits, the fastest, a recommendation) -> prober (probes in workers, a worker reused
    while the batch sizes grow) -> catsdogs.training's workers and engine

`figures` draws the profile's three figures from profile.csv.
"""
