"""The processes, and the one seam to the frameworks: the parent's handle on a worker (`worker`),
the fork server a CPU's workers come from (`fork_server`, and the parent's side of it,
`template`), the thread every worker is started from (`spawner`), the optional imports a worker
skips (`skipped_imports`), and the backends (`backends/`), the only code that imports TensorFlow or
JAX. It imports the data stage and the package's root, never a stage above it."""
