"""Progress a person can read (#38 item 8): ``wdspack pack`` counts records while measuring and samples
while writing, with a rate, and the count moves while a partition is being read (one big partition;
a spawn pool's tasks report as they go), not only when a task finishes. Progress never changes a byte.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from tests.support.demo import ROOT, read_files
from tests.support.progress import ctrl_c_in_the_pool, slow_records
from wdspack.cli import main
from wdspack.packer.executors import ProgressLog, reported, run_tasks
from wdspack.packer.job import _records_of
from wdspack.packer.sources import list_partitions

TEMPLATE = str(ROOT / "examples" / "chat_templates" / "pixtral.jinja")
RECORDS = 1000  # one file of the default 1,000 records per partition: one partition

LINE = re.compile(r"^wdspack (?P<stage>[\w+]+): (?P<done>[\d,]+)(?:/(?P<total>~?[\d,]+))? (?P<unit>\w+)s"
                  r"(?: \(\d+%\))?, \d+:\d\d:\d\d elapsed, (?P<rate>[\d.,e+-]+) (?P=unit)s/s"
                  r"(?:, ETA (?:\d+:\d\d:\d\d|unknown))?$")


def _number(text: str) -> int:
    return int(text.replace(",", "").lstrip("~"))


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    """``RECORDS`` text-only chats in one JSONL file."""
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    with path.open("w") as f:
        for i in range(RECORDS):
            question = " ".join(words[(i + k) % len(words)] for k in range(5 + i % 30))
            answer = " ".join(words[(i * 7 + k) % len(words)] for k in range(5 + i % 60))
            f.write(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": question},
                                                            {"role": "assistant", "content": answer}]}) + "\n")
    return path


def _argv(chat: Path, tekken_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["pack", str(chat), "--output", str(out), "--tokenizer", str(tekken_dir), "--chat-template", TEMPLATE,
            "--seq-len", "512", *extra]


def test_pack_counts_records_and_samples_as_it_goes(chat, tekken_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WDSPACK_PROGRESS_INTERVAL", "0.01")
    assert main(_argv(chat, tekken_dir, tmp_path / "ds")) == 0  # not a terminal: plain lines
    err = capsys.readouterr().err
    ticks = [m for m in map(LINE.match, err.splitlines()) if m]
    measure = [m for m in ticks if m["stage"] == "measure"]
    assert measure and all(m["unit"] == "record" for m in measure), err
    # one partition: a count short of it, and its rate, taken while the partition was being read
    assert any(0 < _number(m["done"]) < RECORDS and float(m["rate"].replace(",", "")) > 0 for m in measure), err
    assert f"wdspack measure: {RECORDS:,} records done in " in err
    write = [m for m in ticks if m["stage"] == "write"]
    assert write and all(m["unit"] == "sample" and m["total"] == f"{RECORDS:,}" for m in write), err
    assert re.search(rf"^wdspack write: {RECORDS:,}/{RECORDS:,} samples done in \d+:\d\d:\d\d$", err, re.M), err
    # the same job without progress writes the same bytes
    assert main(_argv(chat, tekken_dir, tmp_path / "quiet", "--quiet")) == 0
    assert capsys.readouterr().err == ""
    assert read_files(tmp_path / "quiet") == read_files(tmp_path / "ds")


def test_a_spawn_pool_reports_while_its_tasks_run():
    """Two tasks of 1 s in two pool processes: lines with a count appear before either task is done."""
    stream = io.StringIO()
    base = reported()
    log = ProgressLog("measure", "record", total=None, interval=0.1, stream=stream, count=lambda: reported() - base)
    tasks = [(0, 40, 1.0), (1, 40, 1.0)]
    results = list(run_tasks(slow_records, tasks, workers=2, on_done=lambda: stream.write("task done\n")))
    log.close(finished=True)
    assert results == [0, 1] and reported() - base == 80
    lines = stream.getvalue().splitlines()
    before = lines[:lines.index("task done")]
    counts = [_number(m["done"]) for m in map(LINE.match, before) if m]
    assert any(0 < c < 80 for c in counts), lines  # no percentage or ETA without a total
    assert lines[-1].startswith("wdspack measure: 80 records done in "), lines


def test_a_ctrl_c_that_ended_the_pool_is_an_interrupt_here_too():
    """The pool processes end at once on Ctrl-C (exit 130); a driver that missed the signal (it ignores it while a
    pool process starts) reads the broken pool as the interrupt it was, so the job says "interrupted" in one line
    and exits 130 (CI once saw a BrokenProcessPool traceback instead)."""
    with pytest.raises(KeyboardInterrupt):
        list(run_tasks(ctrl_c_in_the_pool, [(0,), (1,), (2,)], workers=2))


def test_the_measure_total_comes_from_the_partitions(tmp_path):
    """Records per partition from the next one's first row; a file's last partition estimated (``~``)."""
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps({"id": f"{i:04d}", "messages": []}) + "\n" for i in range(250)))
    single = tmp_path / "single.jsonl"
    single.write_text(path.read_text().splitlines(keepends=True)[0] * 3)
    parts = list_partitions([str(path), str(single)], records_per_partition=100)
    counts, guessed = _records_of(parts, per=100)
    assert counts == [100, 100, 50, 3] and guessed == {2, 3}
    assert _records_of(parts[3:], per=100) == ([None], set())  # nothing to go by: no total, no percentage
