"""find_batch_size.json as a typed value (catsdogs.find_result.FindResult): what every version
wrote reads back and writes again as it was; what no version wrote is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catsdogs.errors import CatsdogsError
from catsdogs.find_result import FindResult

FIXTURE = Path(__file__).parents[1] / "fixtures" / "find_batch_size.json"  # 0.19.0's API wrote it


def test_an_older_versions_file_reads_back_and_writes_again_to_the_byte():
    # given the file an older version wrote
    text = FIXTURE.read_text()
    # when it is read as a result and written again, then it is the same text
    assert FindResult.from_json(text).to_json() == json.dumps(json.loads(text), indent=2)


def test_the_files_own_order_of_keys_is_kept_where_it_is_not_this_versions():
    # given a file whose keys come in another order (the settings first, as the oldest wrote them)
    data = {"settings": {"name": "old"}, "largest_fitting": 64, "probes": [], "first_not_fitting": 96,
            "reached_max": False, "stopped_by": "memory"}
    # then they are written back in that order, and the keys it left out stay out
    again = FindResult.from_dict(data).to_dict()
    assert list(again) == list(data) and again == data


def test_a_result_as_find_batch_size_answers_leaves_out_what_it_has_not():
    # given a run where nothing fitted, and one with no recommendation or model
    nothing = FindResult.answered(largest_fitting=None, stopped_by="memory", settings={"name": "x"})
    # then no margin, fastest, hand-off, recommendation or model's record is in its file
    assert not {"margin_batch_size", "fastest", "hand_off", "recommendation", "model"} & set(nothing.to_dict())
    some = FindResult.answered(largest_fitting=64, margin_batch_size=None, stopped_by="memory")
    assert some.to_dict()["margin_batch_size"] is None and "recommendation" not in some.to_dict()


@pytest.mark.parametrize("fraction", [0.75, 1.0, 4.0])
def test_any_memory_fraction_xla_takes_reads_back_oversubscribed_too(fraction):
    # given XLA's memory fraction as its variable may set it (above 1: unified memory, oversubscribed)
    result = FindResult.from_dict({"largest_fitting": 8, "memory_fraction": fraction})
    # then it reads back as written
    assert result.memory_fraction == fraction


@pytest.mark.parametrize("data, said", [
    ({"largest_fitting": 8, "memory_fraction": 0}, "memory_fraction must be a positive number"),
    ({"largest_fitting": 8, "stopped_by": "boredom"}, "stopped_by must be one of memory, data, max, failures"),
    ({"largest_fitting": 0}, "largest_fitting must be a batch size"),
    ({"largest_fitting": 8, "probes": [1]}, "probes must be a list of objects"),
    ({"largest_fitting": 8, "order": ["x"]}, "unknown key 'order'"),
])
def test_what_no_version_wrote_is_refused_in_one_line(data, said):
    with pytest.raises(CatsdogsError, match=said):
        FindResult.from_dict(data)
