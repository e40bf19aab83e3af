"""The CLI in-process: exit codes, summary lines, help with examples."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.demo import generate_demo
from wdspack.cli import _parser, main, parse_size
from wdspack.errors import ConfigError
from wdspack.packer.config import PackSummary
from wdspack.packer.job import WORK_DIR

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return generate_demo(tmp_path_factory.mktemp("demo"), records=60, seed=5)


def _argv(demo_data, tekken_dir, out, *extra):
    # 60 demo records hold the 6 deliberately bad ones (10 %, plus a few too long for 2048 tokens): over the
    # default 5 % tolerance, so accept up to half (tests/packer/sources/test_toolcalls.py tests the tolerance itself)
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
    assert "images   fixed 16 tokens each (--tokens-per-image)" in out  # the image policy, said once
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
               "--tokenizer", str(tekken_dir), "--tokens-per-image", "16", "--seq-len", "128"])
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


# ---- item 12 of issue #19: the image policy is explicit, help that can be pasted, quiet pipes ----


def test_text_only_data_needs_no_image_option(tekken_dir, tmp_path, capsys, tekken):
    """--tokenizer with alpaca-style text chats packs without --tokens-per-image (#38 item 4); data with an
    image stops at that record, before any shard, with the fix in one line, and the corrected command is
    not blocked by what the failed job left (#38 item 2)."""
    rows = [{"instruction": f"Say {k}.", "input": "", "output": f"{k}"} for k in range(6)]
    (tmp_path / "alpaca_en_demo.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}}))
    template = str(ROOT / "examples" / "chat_templates" / "pixtral.jinja")
    text = ["pack", str(tmp_path / "dataset_info.json"), "--output", str(tmp_path / "text"), "--tokenizer",
            str(tekken_dir), "--chat-template", template, "--seq-len", "256", "--quiet"]
    assert main(text) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "packed 6" in out and "images   none: text only (no --tokens-per-image)" in out
    manifest = json.loads((tmp_path / "text" / "manifest.json").read_text())
    assert manifest["image_policy"] == {"kind": "none"} and manifest["totals"]["images"] == 0
    # the library: no silent default for images, no refusal for text
    from wdspack.packer.samples import SampleBuilder, SampleConfig
    from wdspack.packer.sources import Record

    builder = SampleBuilder(SampleConfig(tekken, chat_template="{{ messages[0]['content'] }}"))
    assert builder.image_token == "[IMG]"  # the tokenizer declares one: kept, in case of images with a count
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    rec = Record("r1", ({"role": "user", "content": [{"type": "image"}]}, {"role": "assistant", "content": "x"}),
                 (png.getvalue(),))
    with pytest.raises(ConfigError, match="sample 'r1' has an image, but --tokens-per-image was not given"):
        builder.build(rec)


@pytest.mark.slow  # packs the demo twice with the tekken tokenizer
def test_images_without_tokens_per_image_stop_at_the_record_and_leave_nothing_in_the_way(demo_data, tekken_dir,
                                                                                          tmp_path, capsys):
    argv = _argv(demo_data, tekken_dir, tmp_path / "out")
    k = argv.index("--tokens-per-image")
    del argv[k:k + 2]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has an image, but --tokens-per-image was not given" in err, err
    assert "--processor" in err
    assert not list((tmp_path / "out").glob("*.tar"))  # stopped before any shard
    # the corrected command, as the message says, with no --resume and no deleting
    assert main(_argv(demo_data, tekken_dir, tmp_path / "out")) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "manifest.json").exists()


def test_summary_names_the_image_policy():
    base = dict(output="out", samples_read=3, samples_packed=3, dropped_by_reason={}, packs=1, tokens=90,
                images=2, fill_ratio=0.9, shards=1, bytes=1000, seconds=1.0)
    fixed = PackSummary(**base, image_policy={"kind": "fixed", "tokens_per_image": 64}).lines()
    assert "images   fixed 64 tokens each (--tokens-per-image)" in fixed
    qwen = PackSummary(**base, image_policy={"kind": "processor", "name": "proc/", "family": "qwen2_5_vl",
                                             "processor_class": "Qwen2_5_VLProcessor"}).lines()
    assert "images   processor qwen2_5_vl (Qwen2_5_VLProcessor), tokens from each image's size" in qwen
    dynamic = PackSummary(**base, image_policy={"kind": "processor", "name": "Qwen/Qwen2-VL-2B"}).lines()
    assert "images   image processor Qwen/Qwen2-VL-2B, tokens from each image's size" in dynamic
    assert not any(line.startswith("images") for line in PackSummary(**base).lines())


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_of_every_subcommand_has_help():
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in _subcommands().items()
               for a in p._actions if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert missing == []
    assert set(_subcommands()) >= {"pack", "inspect", "verify", "index", "reshard", "upload"}


def _example_commands(help_text: str) -> list[tuple[list[str], list[str]]]:
    """The example commands of a help text: (the lines as shown, the command as a shell reads them)."""
    commands, shown = [], []
    for line in help_text.splitlines():
        text = line.strip()
        if not shown and not re.match(r"(\w+=\S+ )*wdspack ", text):
            continue
        shown.append(line)
        if not text.endswith("\\"):
            commands.append((shown, shlex.split(" ".join(s.strip().rstrip("\\") for s in shown), comments=True)))
            shown = []
    assert not shown, f"a continued line ends the help: {shown}"
    return commands


@pytest.mark.parametrize("command", [None, "pack", "inspect", "verify", "index", "reshard", "upload"])
def test_help_examples_are_copy_pasteable(command, capsys):
    assert main(["--help"] if command is None else [command, "--help"]) == 0
    examples = _example_commands(re.split(r"\nexamples?:\n", capsys.readouterr().out, maxsplit=1)[1])
    assert examples, "every help has worked examples"
    for shown, argv in examples:
        for line in shown:  # one command per line or continued with a backslash, never two run together
            assert len(line) <= 110 and "   " not in line.split("#")[0].strip(), line
        while "=" in argv[0]:
            argv = argv[1:]  # HF_TOKEN=... in front
        assert argv[0] == "wdspack"
        try:
            args = _parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"the example does not parse: {' '.join(argv)}")
        if args.command == "pack" and args.tokenizer:
            assert args.tokens_per_image, f"fixed mode needs --tokens-per-image: {' '.join(argv)}"


@pytest.mark.slow  # builds its own tokenizer (tekken: ~5 s each)
def test_document_too_long_names_split_long_documents(tekken_dir, tmp_path, capsys):
    src = tmp_path / "web.jsonl"
    rows = [{"id": "short", "text": "A short page."}, {"id": "long", "text": "A long page. " * 80}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"id": "chat", "messages": [{"role": "user", "content": "Hi " * 80},
                                                            {"role": "assistant", "content": "Yo"}]}) + "\n")
    template = str(ROOT / "examples" / "chat_templates" / "pixtral.jinja")
    argv = ["pack", str(src), str(chats), "--output", str(tmp_path / "out"), "--tokenizer", str(tekken_dir),
            "--chat-template", template, "--image-token", "[IMG]", "--tokens-per-image", "16",
            "--eos-token", "</s>", "--seq-len", "64", "--max-drop-fraction", "1", "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    dropped = {d["id"]: d for d in map(json.loads, (tmp_path / "out" / "dropped.jsonl").read_text().splitlines())}
    assert dropped["long"]["reason"] == "too_long"
    assert "raise --seq-len or pass --split-long-documents" in dropped["long"]["detail"]
    assert dropped["chat"]["reason"] == "too_long"  # a chat cannot be split: only --seq-len helps it
    assert "--split-long-documents" not in dropped["chat"]["detail"] and "raise --seq-len" in dropped["chat"]["detail"]
    # with the option the document is packed in pieces and nothing of it is dropped
    argv[argv.index("--output") + 1] = str(tmp_path / "split")
    assert main([*argv, "--split-long-documents"]) == 0
    again = {d["id"] for d in map(json.loads, (tmp_path / "split" / "dropped.jsonl").read_text().splitlines())}
    assert again == {"chat"}


def test_broken_template_is_refused_before_the_output(demo_data, tekken_dir, tmp_path, capsys):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n[{{ m.role }}] {{ m.content }}\n")  # no endfor
    argv = _argv(demo_data, tekken_dir, tmp_path / "out")
    argv[argv.index("--chat-template") + 1] = str(broken)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.jinja" in err and "line" in err and "endfor" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def packed_demo(demo_data, tekken_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "ds"
    assert main(_argv(demo_data, tekken_dir, out)) == 0
    return out


def test_inspect_into_a_pipe_closed_early_exits_quietly(packed_demo):
    """`wdspack inspect DS | head`: the reader goes away; no traceback, the exit status of SIGPIPE."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wdspack.cli", "inspect", str(packed_demo)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes a byte: every write it makes hits a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""
    # the same command into a reader that stays is unaffected
    done = subprocess.run([sys.executable, "-m", "wdspack.cli", "inspect", str(packed_demo)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "fill" in done.stdout and done.stderr == ""
    assert not (packed_demo / WORK_DIR).exists()


# -- mistakes answered in one line (issue #38, items 5 and 6) ------------------------------------------


def _one_error_line(capsys, argv: list[str], code: int = 2) -> str:
    assert main(argv) == code
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_misspelled_option_is_one_line_naming_the_option_meant(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    line = _one_error_line(capsys, ["pack", str(data), "--output", str(tmp_path / "o"), "--seq_len", "512"])
    assert line.startswith("wdspack pack: error: the following arguments are required: --seq-len")
    assert "--seq_len is not an option: did you mean --seq-len?" in line and "`wdspack pack --help`" in line
    line = _one_error_line(capsys, ["pack", str(data), "--output", str(tmp_path / "o"), "--seq-len", "512",
                                    "--procesor", "p/"])
    assert "unrecognized arguments: --procesor p/; --procesor is not an option: did you mean --processor?" in line
    line = _one_error_line(capsys, ["inspect", str(tmp_path), "--seq-len", "5"])
    assert line.startswith("wdspack inspect: error: ") and "--seq-len is not an option" in line
    assert not (tmp_path / "o").exists()


def test_a_missing_dataset_is_named_without_a_resume_or_writable_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "half").mkdir()  # a folder without its manifest: a pack job that did not finish
    answers = {
        ("inspect", "nope/"): "wdspack inspect: error: nope: no such folder",
        ("reshard", "nope/", "out/", "--seq-len", "512"): "wdspack reshard: error: nope: no such folder",
        ("inspect", "half/"): "half/manifest.json does not exist: not a packed dataset, or its pack job did not",
        ("upload", "nope/", "org/name"): "wdspack upload: error: nope: no such folder",
        ("index", "nope/"): "wdspack index: error: nope/: no such folder",
        ("index", "half/"): "half/ holds no manifest.json: not a packed dataset, or its pack job did not finish",
        ("index", "https://example.org/ds/"): "https://example.org/ds/: this reads a local folder; download",
    }
    for argv, want in answers.items():
        line = _one_error_line(capsys, list(argv), code=1)
        assert want in line, (argv, line)
        assert "writable" not in line and ("--resume" not in line or argv[:2] == ("index", "half/")), line
    assert main(["verify", "nope/"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "1 problem in nope/"


def test_an_unreachable_hub_dataset_is_one_line_from_every_command(tmp_path):
    """inspect, verify and reshard on an ``hf://`` dataset the Hub cannot serve (closed port): no traceback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the socket is
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf")}
    url = "hf://datasets/org/name@main"
    for argv in (["inspect", url], ["verify", url], ["reshard", url, str(tmp_path / "out"), "--seq-len", "512"]):
        done = subprocess.run([sys.executable, "-m", "wdspack", *argv], env=env, capture_output=True, text=True,
                              timeout=120)
        lines = (done.stdout + done.stderr).splitlines()
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert len(lines) == (2 if argv[0] == "verify" else 1), lines  # verify: the problem, then the count
        assert f"cannot read {url}/manifest.json: ConnectError" in lines[0] and "HF_ENDPOINT" in lines[0]
