"""Stage 3, measurement: the title question on this device, from probes of the sweep's own step.

    profile (throughput, memory, MFU, NVML against batch size) and find_batch_size (the largest
    batch that fits, the fastest, a recommendation; the pure search and the decision are
    `search`'s, the printed answer `find_summary`'s) -> prober (probes in workers, a worker reused
    while the batch sizes grow) -> catsdogs.training's workers and engine

`common` holds what profile and find-batch-size share (probe settings, memory sizes, CSV);
`figures` draws the profile's three figures from profile.csv. Nothing here imports a framework
(its probes run in workers), nor catsdogs.analysis.
"""
