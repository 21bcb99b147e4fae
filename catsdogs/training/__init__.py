"""Stage 2, training: the article's model over a grid of trials, each outcome into the store.

    sweep (the grid, resuming, adaptive rounds) -> runner slots: local worker processes
    (worker) or Ray actors (ray_runner) -> engine (one trial or probe in a worker) ->
    backends (the one seam to Keras's TensorFlow or JAX)

Only `sweep` writes the results store; the engine runs inside workers and answers with typed
records (catsdogs.messages). Probes (profile, find-batch-size) run on the same engine and
workers; catsdogs.measure drives them.
"""
