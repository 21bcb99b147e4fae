"""Stage 4, analysis: a sweep's figures, tables and verdicts, from the results store alone.

    rows (the store's rows, read) -> summary (every table, once: tables' figures and collapses,
    tuning's learning rates, claims' verdicts, critical's noise scale; pure) -> plots and
    markdown -> report (the files)

Nothing here imports Keras, TensorFlow, JAX or catsdogs.training (tests/architecture/test_layout.py).
"""
