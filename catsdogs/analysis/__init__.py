"""Stage 4, analysis: a sweep's figures, tables and verdicts, from the results store alone.

    rows (the store's rows, read) -> tables (cells, figures, tuning, collapses; pure) and
    claims (the article's claims, with verdicts) -> plots and markdown -> report (the files)

Nothing here imports Keras, TensorFlow, JAX or catsdogs.training (tests/test_layout.py).
"""
