"""Workers forked from a template that has imported TensorFlow (catsdogs.runtime.template)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from catsdogs import host
from catsdogs.runtime import template
from catsdogs.runtime.template import Template, TemplateChild, import_key, usable

TESTS = str(Path(__file__).parent)


# --- where a template applies (no process started) -------------------------------------------


def test_a_template_serves_tensorflows_and_jaxs_workers_on_a_cpu_host(monkeypatch):
    monkeypatch.setattr(host, "nvidia_devices", lambda: False)
    assert usable({"KERAS_BACKEND": "tensorflow"})
    # and JAX's (XLA reads its flags as the backend starts, in the child; the cache's settings
    # are given to JAX there: jax_process.start)
    assert usable({"KERAS_BACKEND": "jax"})
    # not where the user turned it off
    assert not usable({"KERAS_BACKEND": "tensorflow", template.ENV: "0"})
    assert not usable({"KERAS_BACKEND": "tensorflow", template.ENV: " 0 "})  # as the other switches read it


def test_a_worker_of_a_backend_catsdogs_refuses_starts_fresh_to_say_so_itself(monkeypatch):
    # given a backend Keras does not know, in the worker's environment or only in this process's
    monkeypatch.setattr(host, "nvidia_devices", lambda: False)
    monkeypatch.setenv("KERAS_BACKEND", "nonesuch")
    # then no template is asked for, and nothing is raised here: the fresh worker says why
    assert not usable({"KERAS_BACKEND": "nonesuch"})
    assert not usable({})


def test_no_template_on_a_host_with_an_nvidia_device(monkeypatch):
    monkeypatch.setattr(host, "nvidia_devices", lambda: True)
    assert not usable({"KERAS_BACKEND": "tensorflow"})


def test_workers_share_a_template_when_they_agree_on_what_an_import_reads():
    # given two workers' environments that differ only where no import looks (a path of the user's)
    one = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", "CATSDOGS_COMPILE_CACHE": "/a"}
    other = {**one, "CATSDOGS_COMPILE_CACHE": "/b"}
    # then they share a template; where TensorFlow's log level or the skipped imports differ, not
    assert import_key(one) == import_key(other)
    assert import_key(one) != import_key({**one, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert import_key(one) != import_key({**one, "CATSDOGS_SKIP_OPTIONAL_IMPORTS": "0"})
    # nor where glibc's malloc is told otherwise (it reads that as a process starts: the template's
    # settings are its children's)
    assert import_key(one) != import_key({**one, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert import_key(one) != import_key({**one, "MALLOC_ARENA_MAX": "1"})


# --- the template's children ------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, dead and not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.getcwd()]), **extra}


@pytest.fixture
def echo_template():
    made = Template(_env(), "template_entries:echo")
    assert made.failed is None
    yield made
    made.close()


def _child(made: Template, tmp_path: Path, **env) -> TemplateChild:
    with open(tmp_path / "child.log", "a") as log:
        return TemplateChild(made, _env(**env), log)


@pytest.mark.slow
def test_a_child_answers_on_its_own_pipes_in_its_own_environment_and_its_status_comes_back(echo_template,
                                                                                           tmp_path):
    # given two children of one template, each with its own environment
    first = _child(echo_template, tmp_path, ECHO_SUFFIX="-1")
    second = _child(echo_template, tmp_path, ECHO_SUFFIX="-2")
    # when each is spoken to, then each answers on its own pipe, from its own environment
    for child, suffix in ((first, "-1"), (second, "-2")):
        child.stdin.write("hello\n")
        assert child.stdout.readline() == f"HELLO{suffix}\n"
    assert first.pid != second.pid and first.poll() is None
    # and when they end, their exit statuses come back as a subprocess's would
    first.stdin.write("exit 7\n")
    assert first.wait(timeout=10) == 7
    os.kill(second.pid, signal.SIGKILL)
    assert second.wait(timeout=10) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):  # and a wait that times out says so
        _child(echo_template, tmp_path).wait(timeout=0.1)


@pytest.mark.slow
def test_a_child_ends_with_the_status_python_would_give_its_entrys_end(tmp_path):
    # given children whose entry returns None, or exits with a message, as a script's main may
    made = Template(_env(), "template_entries:ends")
    try:
        quiet, said = _child(made, tmp_path), _child(made, tmp_path)
        quiet.stdin.write("none\n")
        said.stdin.write("say no data\n")
        # then they end as `python -m` would have: 0, and 1 with the message in their log
        assert quiet.wait(timeout=10) == 0 and said.wait(timeout=10) == 1
        assert "no data" in (tmp_path / "child.log").read_text()
    finally:
        made.close()


@pytest.mark.slow
def test_a_stopped_template_hangs_no_wait_a_childs_end_is_read_from_the_kernel(echo_template, tmp_path):
    import threading

    # given a child at work, and its template stopped (kill -STOP), so it can report nothing
    child = _child(echo_template, tmp_path)
    child.stdin.write("hello\n")
    assert child.stdout.readline() == "HELLO\n"
    os.kill(echo_template.pid, signal.SIGSTOP)
    try:
        # when the child ends, then a wait with no limit returns its status within seconds (a zombie
        # its stopped template has not reaped), where it waited for the template's word for ever
        child.stdin.write("exit 3\n")
        got = []
        waiter = threading.Thread(target=lambda: got.append(child.wait()), daemon=True)
        waiter.start()
        waiter.join(timeout=15)
        assert got == [3]
    finally:
        os.kill(echo_template.pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_template_that_does_not_fork_in_time_is_let_go_and_workers_start_fresh(tmp_path, monkeypatch, capfd):
    # given a stopped template, and the parent's patience for an answer a second
    made = Template(_env(), "template_entries:echo")
    monkeypatch.setattr(template, "ANSWER_SECONDS", 1.0)
    os.kill(made.pid, signal.SIGSTOP)
    try:
        # when a worker is asked of it, then the handle gives up within seconds: no pid, ended
        started = time.monotonic()
        child = _child(made, tmp_path)
        assert child.pid is None and child.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started < 10
        # and the template is let go, said once, and asked for nothing more (workers start fresh)
        assert made.failed and "did not fork a worker" in made.failed
        assert "workers start fresh" in capfd.readouterr().err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(made.pid, signal.SIGCONT)
        made.close()


@pytest.mark.slow
def test_a_templates_children_die_with_it_and_their_handles_say_so(echo_template, tmp_path):
    # given a child at work
    child = _child(echo_template, tmp_path)
    pid = child.pid
    # when the template is killed
    os.kill(echo_template.pid, signal.SIGKILL)
    # then the handle hears of it, and the child is gone (its parent-death signal)
    assert child.wait(timeout=10) == -signal.SIGKILL
    for _ in range(100):
        if not _running(pid):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the template's child outlived it")


@pytest.mark.slow
def test_a_child_maps_the_file_pages_its_template_had_as_a_fresh_process_would(tmp_path):
    # given a template (its imports' shared libraries mapped) and a child forked from it
    made = Template(_env(), "template_entries:resident")
    try:
        child = _child(made, tmp_path)
        rss_file, own_session = child.stdout.readline().split()
        template_kb = int(dict(line.split(":", 1) for line in open(f"/proc/{made.pid}/status"))["RssFile"].split()[0])
        # then its resident file pages are the template's (a fork alone maps none of them again),
        # and it leads a session of its own (a terminal's Ctrl-C is its parent's to handle)
        assert int(rss_file) >= 0.95 * template_kb, (rss_file, template_kb)
        assert own_session == "True"
        child.stdin.close()
        assert child.wait(timeout=10) == 0
    finally:
        made.close()


@pytest.mark.slow
def test_a_template_that_cannot_import_gives_way_to_fresh_workers(tmp_path):
    # given a Python where importing TensorFlow fails
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tensorflow.py").write_text("raise ImportError('a broken install')\n")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": os.pathsep.join([str(broken), os.getcwd()])}
    # when a worker asks for a template
    with open(tmp_path / "w.log", "a") as log:
        child = template.launch_from(("broken", str(broken)), env, log, template.WORKER_MAIN)
    # then none is given (the worker starts fresh and says why in its log), and the template says why
    assert child is None
    assert "a broken install" in template._TEMPLATES[("broken", str(broken))].failed
    template._TEMPLATES.pop(("broken", str(broken)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_worker_from_a_template_trains_as_a_fresh_one(backend, prepared_data, tmp_path, monkeypatch):
    from catsdogs.manifest import require_prepared
    from catsdogs.messages import TrialTask
    from catsdogs.runtime.worker import Worker
    from catsdogs.schema import Status, TrialConfig

    # given a trial, a worker forked from a template and one started fresh
    monkeypatch.setenv("KERAS_BACKEND", backend)
    data = prepared_data(32, (24, 8, 8))
    cfg = TrialConfig(optimizer="adam", batch_size=8, dataset="standard", seed=0, epochs=1, image_size=32,
                      data=require_prepared(data)["fingerprint"]["standard"], backend=backend)
    forked, fresh = Worker(tmp_path / "forked.log"), Worker(tmp_path / "fresh.log", env={template.ENV: "0"})
    try:
        # when each trains it
        records = [w.run(TrialTask(cfg, str(data.resolve()))) for w in (forked, fresh)]
        kinds = [type(w.proc).__name__ for w in (forked, fresh)]
    finally:
        forked.close()
        fresh.close()
    # then the first came from a template and the second is a process of its own, and both trained
    # the same weights to the same losses
    assert kinds == ["TemplateChild", "Popen"]
    assert [r.status for r in records] == [Status.DONE, Status.DONE]
    assert records[0].weights_digest == records[1].weights_digest
    assert records[0].history[-1]["val_loss"] == records[1].history[-1]["val_loss"]


@pytest.mark.slow
def test_a_jax_worker_from_a_template_uses_the_compilation_cache_its_own_environment_names(prepared_data, tmp_path,
                                                                                          monkeypatch):
    from catsdogs.manifest import require_prepared
    from catsdogs.messages import TrialTask
    from catsdogs.runtime.backends import COMPILE_CACHE_ENV
    from catsdogs.runtime.worker import Worker
    from catsdogs.schema import Status, TrialConfig

    # given two JAX workers forked from one template (the cache is not what an import reads), one
    # with a cache folder of its own, the other with the cache off
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    data = prepared_data(32, (24, 8, 8))
    cfg = TrialConfig(optimizer="sgd", batch_size=8, dataset="standard", seed=0, epochs=1, image_size=32,
                      data=require_prepared(data)["fingerprint"]["standard"], backend="jax")
    cache = tmp_path / "cache"
    cached, uncached = (Worker(tmp_path / f"{n}.log", env={COMPILE_CACHE_ENV: value})
                        for n, value in (("cached", str(cache)), ("uncached", "off")))
    try:
        # when the first trains, then the second
        first = cached.run(TrialTask(cfg, str(data.resolve())))
        kinds = [type(cached.proc).__name__]
        entries = sorted(p.name for p in cache.rglob("*") if p.is_file())
        second = uncached.run(TrialTask(cfg, str(data.resolve())))
        kinds.append(type(uncached.proc).__name__)
    finally:
        cached.close()
        uncached.close()
    # then both came from the template; the first wrote its compilations to its folder, and the
    # second, whose cache is off, read none of them and wrote nothing there
    assert kinds == ["TemplateChild", "TemplateChild"]
    assert first.status == second.status == Status.DONE
    assert entries and second.compile_cache_hits == 0 and second.compiles > 0
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == entries
