"""catsdogs.runtime.worker.run_together: tasks run at once in several workers (stand-in workers:
no process starts)."""

from __future__ import annotations

import _thread
import threading

import pytest

from catsdogs.runtime.worker import run_together


class StandIn:
    """A worker's `run`, `kill`: answers f"{name}:{task}" after `gate` opens (if any)."""

    def __init__(self, name, gate=None, fail_on=None, on_run=None):
        self.name, self.gate, self.fail_on, self.on_run = name, gate, fail_on, on_run
        self.ran, self.killed = [], threading.Event()

    def run(self, task):
        self.ran.append(task)
        if self.on_run:
            self.on_run(task)
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if task == self.fail_on:
            raise RuntimeError(f"{self.name} broke on {task}")
        return f"{self.name}:{task}"

    def kill(self):
        self.killed.set()


def test_each_worker_takes_the_next_task_as_it_ends_one_and_every_record_comes_back_by_its_key():
    # given two workers that each wait until both are running (so neither can take every task)
    both = threading.Barrier(2, timeout=10)
    workers = [StandIn("a", on_run=lambda task: both.wait() if task in ("t0", "t1") else None), StandIn("b")]
    workers[1].on_run = workers[0].on_run
    # when five tasks run together
    records = run_together(workers, [(n, f"t{n}") for n in range(5)])
    # then every task ran once, the first two at once in different workers, and each record is keyed
    assert sorted(t for w in workers for t in w.ran) == [f"t{n}" for n in range(5)]
    assert {workers[0].ran[0], workers[1].ran[0]} == {"t0", "t1"}
    assert set(records) == set(range(5)) and all(records[n].endswith(f":t{n}") for n in range(5))


def test_fewer_tasks_than_workers_leave_the_rest_unused_and_none_runs_nothing():
    workers = [StandIn("a"), StandIn("b"), StandIn("c")]
    assert run_together(workers, [("only", "t")]) == {"only": "a:t"}
    assert [w.ran for w in workers] == [["t"], [], []]
    assert run_together(workers, []) == {}


def test_an_error_in_one_worker_is_raised_once_the_others_ended_their_tasks_and_they_took_no_more():
    # given a worker that breaks on its task while the other's is still running
    gate, started = threading.Event(), threading.Event()
    slow = StandIn("b", gate=gate, on_run=lambda task: started.set())

    def break_once_the_other_runs(task):
        started.wait(timeout=10)
        threading.Timer(0.3, gate.set).start()  # the other's task ends after the failure

    broken = StandIn("a", fail_on="t0", on_run=break_once_the_other_runs)
    # when they run together, then the error is raised, the other's task ended, and nothing more ran
    with pytest.raises(RuntimeError, match="a broke on t0"):
        run_together([broken, slow], [(n, f"t{n}") for n in range(4)])
    assert broken.ran == ["t0"] and slow.ran == ["t1"]


def test_ctrl_c_while_they_run_stops_every_worker_and_is_raised():
    # given two workers whose tasks wait until they are killed, and a Ctrl-C once both run
    running = threading.Barrier(2, timeout=10)
    workers = []

    def hold(task):
        running.wait()
        if task == "t0":
            _thread.interrupt_main()  # Ctrl-C reaches the main thread, as a terminal's would

    for name in "ab":
        worker = StandIn(name, on_run=hold)
        worker.gate = worker.killed  # each run ends when its worker is killed
        workers.append(worker)
    # when they run together, then the Ctrl-C is raised and every worker was killed
    with pytest.raises(KeyboardInterrupt):
        run_together(workers, [(n, f"t{n}") for n in range(2)])
    assert all(w.killed.is_set() for w in workers)
