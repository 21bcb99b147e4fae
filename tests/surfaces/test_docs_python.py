"""docs/python.md runs as written: its Python blocks, in order, as one script in a fresh process
in an empty folder (a user's notebook, top to bottom)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "python.md"


def blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_walk_through_has_the_steps_it_promises():
    code = "\n".join(blocks(DOC.read_text()))
    for step in ("catsdogs.find_batch_size(model, (x, y)", "advice.plot(", "BatchSizeAdvice.from_json",
                 "batch_size=advice.batch_size", "catsdogs.keras.GradientNoiseScale((x, y)"):
        assert step in code, step


@pytest.mark.slow
def test_the_walk_through_runs_as_written(tmp_path, brief_probes):
    # given the page's code blocks as one script, run where a user would, in an empty folder (its
    # search's probes timed briefly: the line before it)
    script = tmp_path / "walk_through.py"
    script.write_text("\n\n".join([brief_probes, *blocks(DOC.read_text())]))
    # when it runs
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # then it ends cleanly, with the advice, a noise scale after each of the fit's epochs, the figure
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^BatchSizeAdvice\(batch_size=\d+, learning_rate=", done.stdout, flags=re.M), done.stdout
    assert re.findall(r"^epoch (\d): B_simple \d", done.stdout, flags=re.M) == ["1", "2", "3"], done.stdout
    assert (tmp_path / "outputs" / "time-to-target.png").stat().st_size > 0
    assert (tmp_path / "outputs" / "find-batch-size" / "find_batch_size.json").is_file()
