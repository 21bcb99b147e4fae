"""Files catsdogs writes: whole or absent, and JSON that every reader takes."""

from __future__ import annotations

import json
import math

import numpy as np

from catsdogs.files import write_json_atomic


def _refuse(constant: str):
    raise ValueError(f"not JSON: {constant}")


def test_a_json_file_is_strict_with_what_is_not_finite_written_as_null(tmp_path):
    # given a result holding NaN and infinities, as a NaN model's find-batch-size had (nested, and numpy's too)
    result = {"b_simple": math.nan, "interval": [2.0, math.inf], "rows": [{"worst": -math.inf, "ok": 1.5}],
              "numpy": np.float64("nan"), "text": "NaN", "count": 3}
    # when written
    path = write_json_atomic(tmp_path / "r.json", result)
    # then a strict reader (one that refuses NaN and Infinity) reads it, each such value as null
    read = json.loads(path.read_text(), parse_constant=_refuse)
    assert read == {"b_simple": None, "interval": [2.0, None], "rows": [{"worst": None, "ok": 1.5}], "numpy": None,
                    "text": "NaN", "count": 3}

