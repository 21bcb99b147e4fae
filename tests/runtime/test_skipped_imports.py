"""A worker starts without the optional modules Keras and TensorFlow only try to import."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from catsdogs.runtime import skipped_imports


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Given: a framework package that tries an optional module, the optional module, and a
    user's module that imports it; none imported yet."""
    (tmp_path / "fakefw").mkdir()
    (tmp_path / "fakefw" / "__init__.py").write_text(textwrap.dedent("""
        try:
            import fakeopt.sub as opt
        except ImportError:
            opt = None
    """))
    (tmp_path / "fakeopt").mkdir()
    (tmp_path / "fakeopt" / "__init__.py").write_text("")
    (tmp_path / "fakeopt" / "sub.py").write_text("VALUE = 1\n")
    (tmp_path / "userland.py").write_text("import fakeopt.sub as opt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("fakefw", "fakeopt", "fakeopt.sub", "userland"):
        sys.modules.pop(name, None)


def test_a_frameworks_try_of_an_optional_module_fails_as_if_it_were_not_installed(packages):
    with skipped_imports.skipping("tensorflow", skipped=("fakeopt",), frameworks=("fakefw",)) as finder:
        import fakefw
    assert fakefw.opt is None
    assert "fakeopt" not in sys.modules
    assert finder.skips == [("fakeopt", "fakefw")]


def test_the_same_module_imported_by_anything_else_is_imported(packages):
    with skipped_imports.skipping("tensorflow", skipped=("fakeopt",), frameworks=("fakefw",)) as finder:
        import userland
    assert userland.opt.VALUE == 1
    assert finder.skips == []


def test_once_the_framework_is_imported_the_optional_module_imports_as_usual(packages):
    with skipped_imports.skipping("tensorflow", skipped=("fakeopt",), frameworks=("fakefw",)):
        import fakefw  # noqa: F401
    import fakeopt.sub
    assert fakeopt.sub.VALUE == 1
    assert not any(isinstance(f, skipped_imports._Skipper) for f in sys.meta_path)


def test_a_worker_told_to_import_what_its_framework_tries_skips_nothing(packages, monkeypatch):
    # given a worker whose resident memory is the measurement (a probe's on the CPU)
    monkeypatch.setenv(skipped_imports.ENV, "0")
    with skipped_imports.skipping("tensorflow", skipped=("fakeopt",), frameworks=("fakefw",)) as finder:
        import fakefw
    assert fakefw.opt is not None and finder.skips == []


def test_the_backends_own_module_is_never_skipped(packages):
    with skipped_imports.skipping("fakeopt", skipped=("fakeopt",), frameworks=("fakefw",)) as finder:
        import fakefw
    assert fakefw.opt is not None and finder.skips == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_workers_start_imports_none_of_the_optional_modules_but_its_backend(backend):
    # given: a fresh interpreter starting as a worker does (backends.current, its start, the engine)
    code = textwrap.dedent("""
        import json, sys
        from catsdogs.runtime import backends, skipped_imports
        backend = backends.current()
        with skipped_imports.skipping(backend.NAME) as finder:
            backend.setup_device(None)
            backend.start()
            from catsdogs.training import engine, steps
        print(json.dumps({"loaded": sorted(m for m in skipped_imports.SKIPPED if m in sys.modules),
                          "importers": sorted({i.partition('.')[0] for _, i in finder.skips})}))
    """)
    env = {**__import__("os").environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # when
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    # then: only the backend itself is loaded, and what was skipped was the frameworks' tries
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == (["jax"] if backend == "jax" else [])
    assert set(seen["importers"]) <= set(skipped_imports.FRAMEWORKS)
