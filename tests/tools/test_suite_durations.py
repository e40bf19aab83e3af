"""tools/suite_durations.py: the phase records the conftest hook writes become the development page's tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT
from tools import suite_durations


def _records(path, rows):
    path.write_text("".join(json.dumps(dict(zip(("test", "when", "seconds", "outcome", "integration"), r))) + "\n"
                            for r in rows))
    return path


def test_tables_add_up_and_put_the_slowest_first(tmp_path):
    rows = [("tests/a/test_x.py::test_one", "setup", 4.0, "passed", False),
            ("tests/a/test_x.py::test_one", "call", 1.0, "passed", False),
            ("tests/a/test_x.py::test_one", "teardown", 0.5, "passed", False),
            ("tests/a/test_x.py::test_two", "setup", 0.0, "passed", False),
            ("tests/a/test_x.py::test_two", "call", 0.25, "failed", False),
            ("tests/a/test_x.py::test_two", "teardown", 0.0, "passed", False),
            ("tests/models/test_y.py::test_big", "setup", 0.0, "passed", True),
            ("tests/models/test_y.py::test_big", "call", 9.0, "passed", True),
            ("tests/models/test_y.py::test_big", "teardown", 0.0, "passed", True)]
    tests = suite_durations.read_records(_records(tmp_path / "d.jsonl", rows))
    assert tests["tests/a/test_x.py::test_one"]["setup"] == 4.0
    assert tests["tests/a/test_x.py::test_two"]["outcome"] == "failed"
    text = suite_durations.markdown(tests, top=2)
    lines = text.splitlines()
    assert "| fast | 2 | 6 | 4 | 1 |" in lines and "| integration | 1 | 9 | 0 | 9 |" in lines
    slow = [line for line in lines if line.startswith("| `tests/")]
    assert slow[0].startswith("| `tests/models/test_y.py::test_big` | integration | 0.0 | 9.0 | 9.0 |")
    assert slow[1].startswith("| `tests/a/test_x.py::test_one` | fast | 4.0 | 1.0 | 5.5 |")
    assert "| `tests/a/test_x.py` | 2 | 4.0 | 1.2 | 5.8 |" in lines  # the modules' table


def test_the_hook_writes_every_phase_once(tmp_path):
    """A real pytest run in a child with the variable set: three phases per test, from this suite's conftest."""
    out = tmp_path / "d.jsonl"
    env = {**os.environ, "WDSPACK_TEST_DURATIONS": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/tools/test_suite_durations.py::test_tables_add_up_and_put_the_slowest_first"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["when"] for r in records] == ["setup", "call", "teardown"] and not records[0]["integration"]


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert suite_durations.main([str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "WDSPACK_TEST_DURATIONS=" in err
