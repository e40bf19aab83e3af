"""The CLI in-process: exit codes, summary lines, help with examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo_job import generate_demo
from wdspack.cli import main, parse_size
from wdspack.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return generate_demo(tmp_path_factory.mktemp("demo"), records=60, seed=5)


def _argv(demo_data, tekken_dir, out, *extra):
    # 60 demo records hold the 6 deliberately bad ones (10 %, plus a few too long for 2048 tokens): over the
    # default 5 % tolerance, so accept up to half (test_sources_chat_formats.py tests the tolerance itself)
    return ["pack", str(demo_data / "llava.jsonl"), str(demo_data / "messages.jsonl"), "--output", str(out),
            "--tokenizer", str(tekken_dir), "--chat-template",
            str(ROOT / "examples" / "chat_templates" / "pixtral.jinja"), "--image-token", "[IMG]",
            "--tokens-per-image", "16", "--seq-len", "2048", "--max-images", "8", "--max-drop-fraction", "0.5",
            "--quiet", *extra]


def test_pack_prints_the_summary(demo_data, tekken_dir, tmp_path, capsys):
    assert main(_argv(demo_data, tekken_dir, tmp_path / "out")) == 0
    out = capsys.readouterr().out
    assert "samples  read " in out and "dropped" in out and "too_long" in out
    assert "packs " in out and "fill " in out and "shards " in out and "time " in out
    assert (tmp_path / "out" / "manifest.json").exists()
    # Packing again into the same folder is refused with exit code 1 and a one-line reason;
    # --resume on a finished dataset is a no-op that succeeds.
    assert main(_argv(demo_data, tekken_dir, tmp_path / "out")) == 1
    assert "already holds a packed dataset" in capsys.readouterr().err
    assert main(_argv(demo_data, tekken_dir, tmp_path / "out", "--resume")) == 0


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "magic"], "unknown --algorithm 'magic'"),
    (["--shard-size", "lots"], "size 'lots' not understood"),
    (["--tokens-per-image", "many"], "--tokens-per-image 'many'"),
    (["--chat-template", "/nonexistent.jinja"], "is not a file"),
])
def test_bad_arguments_exit_2_with_one_line(demo_data, tekken_dir, tmp_path, capsys, extra, message):
    assert main(_argv(demo_data, tekken_dir, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_source_is_exit_1(tekken_dir, tmp_path, capsys):
    rc = main(["pack", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o"),
               "--tokenizer", str(tekken_dir), "--seq-len", "128"])
    assert rc == 1
    assert "nope.jsonl" in capsys.readouterr().err


def test_help_carries_examples(capsys):
    assert main(["--help"]) == 0
    assert "examples:" in capsys.readouterr().out
    assert main(["pack", "--help"]) == 0
    assert "--resume" in capsys.readouterr().out
    assert main([]) == 2


def test_parse_size():
    assert parse_size("512MB") == 512_000_000
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("100000") == 100_000
    with pytest.raises(ConfigError):
        parse_size("-1MB")
