"""Stage 2, training: the article's model over a grid of trials, each outcome into the store.

    study (a plan run to the end: its trials, adaptive rounds) -> sweep (one pass over a grid,
    resuming, the store) -> slots: local worker processes (local_slot.LocalSlot) or Ray actors
    (ray_runner.RaySlot) -> engine (one task in a worker: a trial; probes: a probe) on steps
    (the decoded data and compiled steps a worker keeps) -> backends (the one seam to Keras's
    TensorFlow or JAX)

Only `sweep` writes the results store; the engine runs inside workers and answers with typed
records (catsdogs.messages). Probes (profile, find-batch-size) run on the same engine and
workers; catsdogs.measure drives them. `model` (the article's network, Keras) and `costs` (what
it costs, in closed form, no framework) belong here: the engine builds the one, the memory
prediction of find-batch-size reads the other.
"""
