"""The worker process: `python -m catsdogs.training.child`, started by the parent's handle
(catsdogs.runtime.worker.Worker) or forked by a template (catsdogs.runtime.template).

It starts the framework once (catsdogs.runtime.backends), then reads tasks from its stdin, one
JSON line each (catsdogs.messages), runs each with the engine (which keeps decoded data and
compiled training steps between tasks), and answers on its own channel with JSON lines: `ready`,
then per task `started`, any number of `progress`, and one `result` holding the task's record.
Anything else the process prints (TensorFlow's logs included) goes to its log file, never into
the channel. A worker that cannot run what it was started for says `unfit` once and ends.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading

from catsdogs import messages
from catsdogs.runtime import backends, skipped_imports
from catsdogs.runtime.worker import CPUS_ENV, MEMORY_CAP_ENV


def _channel() -> callable:
    """Keep the real stdout for messages and point fd 1 at stderr (the log): a framework that
    prints must not corrupt the channel. Messages may come from two threads (a trial's, and a
    digest's delivered after it: engine.start_weights_digest), each written whole."""
    fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(fd, "w", buffering=1)
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def send(kind: str, payload: dict | None = None) -> None:
        line = json.dumps({"type": kind, **(payload or {})}, default=str) + "\n"
        with lock:
            out.write(line)
            out.flush()

    return send


def _pin_cpus() -> None:
    cpus = os.environ.get(CPUS_ENV)
    if cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def main() -> int:
    send = _channel()
    _pin_cpus()
    backend = backends.current()
    preloaded = backend.NAME in sys.modules  # started before catsdogs could set it up
    cap = int(os.environ.get(MEMORY_CAP_ENV) or 0) or None
    with skipped_imports.skipping(backend.NAME):  # the framework's optional imports a worker never uses
        device = backend.setup_device(cap)  # before the framework touches the GPU; starts it with the
        backend.start()  # process's settings (backends.process_settings)
        unfit = _unfit(backend, preloaded)
        if unfit:  # every task would fail alike: said once, and the parent stops
            send("unfit", {"error": unfit})
            return 3
        from catsdogs.training import engine, steps  # the framework's settings are made: import it
    freeze_imported()

    send("ready", {"pid": os.getpid(), "device": device, "frozen": gc.get_freeze_count()})
    for line in sys.stdin:
        if not line.strip():
            continue
        task = messages.decode_task(line)
        backend.reset_peak_memory()
        send("started")
        record = engine.run_task(task, emit=lambda kind, payload: send(kind, {"payload": payload}))
        send("result", {"record": record.as_dict(), "shapes": steps.STEPS.shapes()})
    for thread in list(engine.DIGESTS):  # digests still owed for trials already answered
        thread.join()
    return 0


def freeze_imported() -> None:
    """Leave what the start imported out of the garbage collector's full passes (gc.freeze): the
    framework's hundreds of thousands of objects live as long as the worker, and each full pass
    walked them all, which a probe paid at every one (steps.StepCache.clear collects the last
    probe's model before the next one's memory is read). What the tasks make is collected as
    before, the models a probe drops included; the start's own few garbage objects stay."""
    gc.freeze()


def _unfit(backend, preloaded: bool) -> str:
    """Why this worker cannot run what it was started for, or "": the settings it was started
    with (backends.process_settings) that its framework does not run with. JAX reads its XLA flags
    once, as its backend starts: started before this process's start could set them (by a
    sitecustomize, a .pth file, PYTHONSTARTUP or a wrapper), it keeps the flags it found (imported
    only, as in a template's child, it takes catsdogs' flags all the same: jax_process.start)."""
    wanted, running = backends.process_settings(), backend.running_settings()
    if wanted == running:
        return ""
    cause = (f"{backend.NAME} was already imported when the worker started (by a sitecustomize, a .pth "
             f"file, PYTHONSTARTUP or a wrapper around python), before catsdogs could set it up"
             if preloaded else f"{backend.NAME} did not take catsdogs' settings")
    return (f"a worker started for {backends.describe_settings(wanted)} runs "
            f"{backends.describe_settings(running)}: {cause}. Run catsdogs where nothing imports "
            f"{backend.NAME} at Python's start (`python -c \"import sys; print('{backend.NAME}' in sys.modules)\"` "
            "prints False), or plan the trials for what it runs (e.g. --no-deterministic)")



if __name__ == "__main__":
    code = main()
    # Every message is flushed and every digest sent (main waits for them): end here, without the
    # framework's own teardown, which took TensorFlow a second at every worker's end (JAX half one)
    sys.stderr.flush()
    os._exit(code)
