"""How a job starts (issue #19, items 7 and 8; #38 items 2 and 3): a configuration that cannot work is
refused before the output is touched; a job that failed (or wrote nothing) does not block its corrected
re-run; an interrupted job with finished work keeps it for --resume; outside a terminal, progress is a
plain line every N seconds."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support.demo import demo_sources, generate_demo, read_files
from wdspack.cli import main
from wdspack.errors import ConfigError, OutputError, TooManyDropsError
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.executors import ProgressLog
from wdspack.packer.job import WORK_DIR, pack_dataset
from wdspack.packer.reshard import reshard_dataset

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "examples" / "chat_templates" / "pixtral.jinja")
STARTING_OVER = "wrote nothing yet (no tokenized partition, no shard); starting it over"


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return generate_demo(tmp_path_factory.mktemp("demo"), records=40, seed=11)


def _argv(demo_data, tekken_dir, out, *extra, template: str | None = TEMPLATE) -> list[str]:
    # the demo's deliberately bad records are 15 % of 40: accept them (the tolerance is tested elsewhere)
    return ["pack", *demo_sources(demo_data), "--output", str(out), "--tokenizer", str(tekken_dir),
            *(["--chat-template", template] if template else []), "--image-token", "[IMG]",
            "--tokens-per-image", "16", "--seq-len", "2048", "--max-images", "8", "--max-drop-fraction", "0.5",
            *extra]


def _metas(out: Path) -> list[Path]:
    return sorted((out / WORK_DIR / "spool").glob("*.meta"))


@pytest.fixture(scope="module")
def reference(demo_data, tekken_dir, tmp_path_factory) -> dict[str, bytes]:
    """The files of a clean, uninterrupted run of the corrected command."""
    out = tmp_path_factory.mktemp("reference") / "ds"
    assert main(_argv(demo_data, tekken_dir, out, "--quiet")) == 0
    return read_files(out)


# ---- item 7: checked before the work folder ------------------------------------------------------


def test_a_tokenizer_that_does_not_load_leaves_nothing_behind(demo_data, tekken_dir, tmp_path, capsys, reference):
    out = tmp_path / "ds"
    bad = _argv(demo_data, tekken_dir, out, "--quiet")
    bad[bad.index("--tokenizer") + 1] = str(tmp_path / "no-such-tokenizer")
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer '{tmp_path / 'no-such-tokenizer'}': no such folder" in err
    assert not out.exists()  # nothing created: nothing to resume, nothing to delete
    assert main(_argv(demo_data, tekken_dir, out, "--quiet")) == 0  # the fix, as a plain re-run
    assert read_files(out) == reference


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a tokenizer or processor fails the test: the answer must come from the files alone."""
    import transformers

    def load(*args, **kwargs):
        raise AssertionError("a tokenizer or processor was loaded")

    for cls in (transformers.AutoTokenizer, transformers.AutoProcessor):
        monkeypatch.setattr(cls, "from_pretrained", load)


def test_a_missing_chat_template_is_answered_before_the_tokenizer_loads(demo_data, tekken_dir, tmp_path, capsys,
                                                                        no_loading):
    """#38 item 3: chat records, no --chat-template, and none in the tokenizer's folder."""
    out = tmp_path / "ds"
    assert main(_argv(demo_data, tekken_dir, out, "--quiet", template=None)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--tokenizer '{tekken_dir}' has no chat template" in err, err
    assert err.endswith("pass --chat-template FILE")
    assert not out.exists()  # nothing to resume, nothing to delete


def _tiny_tokenizer(folder: Path, *, template: bool = True) -> Path:
    """A real (tiny) fast tokenizer's files: tokenizer.json with '<image>' added, and its config."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "<s>": 2, "</s>": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<image>"])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    if template:
        config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_an_image_token_not_in_the_vocabulary_is_answered_before_the_tokenizer_loads(demo_data, tmp_path, capsys,
                                                                                     no_loading):
    from wdspack.packer.precheck import precheck
    from wdspack.packer.samples import SampleConfig

    folder = _tiny_tokenizer(tmp_path / "tok")
    argv = _argv(demo_data, folder, tmp_path / "ds", "--quiet", template=None)
    argv[argv.index("--image-token") + 1] = "[IMG]"  # tekken's, not this tokenizer's
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"wdspack pack: error: image token '[IMG]' is not a single token in the vocabulary of '{folder}'; "
                   "pass the model's image token with --image-token"), err
    assert not (tmp_path / "ds").exists()
    # what the files answer for: the declared/guessed token, and the template where chats need one
    precheck(SampleConfig(str(folder), tokens_per_image=4), lambda: True)  # '<image>' is in the vocabulary
    bare = _tiny_tokenizer(tmp_path / "bare", template=False)
    with pytest.raises(ConfigError, match="has no chat template"):
        precheck(SampleConfig(str(bare), tokens_per_image=4), lambda: True)
    precheck(SampleConfig(str(bare), tokens_per_image=4), lambda: False)  # documents or captions: none needed


FAILED_OVER = "holds what a failed pack job left (no shard); starting over"


def test_a_failed_job_never_blocks_its_corrected_command(demo_data, tekken_dir, tmp_path, capsys, caplog,
                                                         reference):
    """#38 item 2: a wrong --image-root drops every image record (over the tolerance, after every partition was
    tokenized); the corrected command runs as typed, without --resume and without deleting anything."""
    for extra in ((), ("--resume",)):  # --resume too: the failed job had other arguments, so nothing is kept
        out, wrong = tmp_path / f"ds{len(extra)}", tmp_path / "other-folder"
        wrong.mkdir(exist_ok=True)
        assert main(_argv(demo_data, tekken_dir, out, "--quiet", "--image-root", str(wrong))) == 1
        err = capsys.readouterr().err
        assert "missing_image" in err and "--resume --max-drop-fraction" in err
        assert _metas(out) and (out / "dropped.jsonl").exists() and not list(out.glob("*.tar"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="wdspack.packer.job"):
            assert main(_argv(demo_data, tekken_dir, out, "--quiet", *extra)) == 0, capsys.readouterr().err
        notices = [r.getMessage() for r in caplog.records if FAILED_OVER in r.getMessage()]
        assert len(notices) == 1 and str(out) in notices[0] and "\n" not in notices[0]
        assert read_files(out) == reference  # nothing of the failed run leaks into the result


def test_a_failed_job_resumed_as_the_error_says_keeps_its_tokenized_samples(demo_data, tekken_dir, tmp_path,
                                                                          capsys, caplog, reference):
    out = tmp_path / "ds"
    strict = _argv(demo_data, tekken_dir, out, "--quiet")
    strict[strict.index("--max-drop-fraction") + 1] = "0"
    assert main(strict) == 1  # over the drop tolerance: every partition was tokenized and is kept
    assert "--resume --max-drop-fraction" in capsys.readouterr().err
    metas = {m.name: m.stat().st_mtime_ns for m in _metas(out)}
    assert metas
    with caplog.at_level(logging.WARNING, logger="wdspack.packer.job"):  # the fix the error named
        assert main(_argv(demo_data, tekken_dir, out, "--quiet", "--resume")) == 0
    assert not [r for r in caplog.records if FAILED_OVER in r.getMessage() or STARTING_OVER in r.getMessage()]
    assert read_files(out) == reference


# ---- item 7 for reshard, which runs the same job ---------------------------------------------------


@pytest.fixture(scope="module")
def packed(demo_data, tekken_dir, tmp_path_factory) -> Path:
    """The demo packed at 2048 tokens, 8 images and 3 packs a shard (the reshard tests' source): ``reference``'s
    command with ``--shard-packs 3``, so the sample builder (the tokenizer) that ``reference`` loaded serves it too
    (the bytes of ``pack_dataset`` with those settings, one tokenizer load fewer)."""
    out = tmp_path_factory.mktemp("packed") / "ds"
    assert main(_argv(demo_data, tekken_dir, out, "--shard-packs", "3", "--quiet")) == 0
    return out


def test_reshard_that_failed_before_writing_anything_is_started_over(packed, tmp_path, caplog):
    config = PackConfig(seq_len=4096, max_images=16)
    source = tmp_path / "source"
    shutil.copytree(packed, source)
    clean = tmp_path / "clean"
    reshard_dataset(str(source), clean, config=config)
    first = sorted(source.glob("*.tar"))[0]
    first.rename(first.with_suffix(".away"))  # the first task fails at once: nothing is spooled
    out = tmp_path / "ds"
    with pytest.raises(FileNotFoundError):
        reshard_dataset(str(source), out, config=config)
    assert (out / WORK_DIR / "job.json").exists() and _metas(out) == []
    first.with_suffix(".away").rename(first)
    with caplog.at_level(logging.WARNING, logger="wdspack.packer.job"):
        summary = reshard_dataset(str(source), out, config=config)
    assert any(STARTING_OVER in r.getMessage() for r in caplog.records)
    assert summary.packs > 0 and read_files(out) == read_files(clean)


def test_reshard_that_failed_does_not_block_the_corrected_one(packed, tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(TooManyDropsError):  # most samples are longer than 256 tokens
        reshard_dataset(str(packed), out, config=PackConfig(seq_len=256, run=RunOptions(max_drop_fraction=0)))
    assert _metas(out)
    clean = tmp_path / "clean"
    reshard_dataset(str(packed), clean, config=PackConfig(seq_len=4096))
    reshard_dataset(str(packed), out, config=PackConfig(seq_len=4096))  # started over: a failed job, no shard
    assert read_files(out) == read_files(clean)


def test_an_interrupted_job_with_finished_work_keeps_refusing(packed, tmp_path, monkeypatch):
    """Not a failure of wdspack's (here the shard writer dies): the tokenized work is kept for --resume."""
    from wdspack.packer import job

    def killed(*args):
        raise KeyboardInterrupt

    out = tmp_path / "ds"
    monkeypatch.setattr(job, "_write_shard", killed)
    with pytest.raises(KeyboardInterrupt):
        reshard_dataset(str(packed), out, config=PackConfig(seq_len=4096))
    monkeypatch.undo()
    assert _metas(out)
    with pytest.raises(OutputError, match="holds an unfinished pack job; pass --resume"):
        reshard_dataset(str(packed), out, config=PackConfig(seq_len=2048))
    with pytest.raises(OutputError, match="other inputs or arguments"):
        reshard_dataset(str(packed), out, config=PackConfig(seq_len=2048), resume=True)
    reshard_dataset(str(packed), out, config=PackConfig(seq_len=4096), resume=True)


# ---- item 8: progress lines where no terminal draws a bar ----------------------------------------

_LINE = re.compile(r"^wdspack (measure|write): [\d,]+(/~?[\d,]+)? (record|sample|part|shard)s( \(\d+%\))?, "
                   r"\d+:\d\d:\d\d elapsed, [\d.,e+-]+ (record|sample|part|shard)s/s(, ETA (\d+:\d\d:\d\d|unknown))?$")


def test_progress_lines_when_stderr_is_not_a_terminal(demo_data, tekken_dir, tmp_path, capsys, monkeypatch):
    # a tick every 5 ms: a measure stage that is quick (a tokenizer already loaded in this process) still gets one
    monkeypatch.setenv("WDSPACK_PROGRESS_INTERVAL", "0.005")
    assert main(_argv(demo_data, tekken_dir, tmp_path / "ds", "--shard-packs", "1")) == 0  # no --quiet
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    ticks = [line for line in lines if _LINE.match(line)]
    assert any(line.startswith("wdspack measure: ") for line in ticks), captured.err
    assert any(re.fullmatch(r"wdspack measure: [\d,]+ records done in \d+:\d\d:\d\d", line) for line in lines)
    assert "\r" not in captured.err  # no bar drawn into a log
    assert all(_LINE.match(line) or " done in " in line for line in lines), lines
    assert "samples  read " in captured.out
    # --quiet: none
    assert main(_argv(demo_data, tekken_dir, tmp_path / "quiet", "--quiet")) == 0
    assert capsys.readouterr().err == ""


def test_progress_log_says_stage_counts_rate_and_eta():
    stream = io.StringIO()
    log = ProgressLog("write", "shard", total=4, interval=0.05, stream=stream)
    log.update()
    log.update()
    time.sleep(0.3)
    log.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all(_LINE.match(line) for line in lines[:-1]), lines
    assert lines[0].startswith("wdspack write: 2/4 shards (50%), ") and "ETA 0:00:0" in lines[0]
    assert re.fullmatch(r"wdspack write: 2/4 shards stopped in 0:00:0\d", lines[-1])
    quick = io.StringIO()
    log = ProgressLog("measure", "part", total=1, interval=30, stream=quick)
    log.update()
    log.close()
    assert quick.getvalue() == ""  # a stage shorter than the interval stays silent


def test_a_bad_progress_interval_is_a_usage_error(demo_data, tekken_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WDSPACK_PROGRESS_INTERVAL", "soon")
    assert main(_argv(demo_data, tekken_dir, tmp_path / "ds")) == 2
    err = capsys.readouterr().err
    assert "WDSPACK_PROGRESS_INTERVAL='soon'" in err and "positive number" in err
    assert not (tmp_path / "ds").exists()


def test_the_output_folder_is_checked_before_anything_loads(demo_data, tmp_path, monkeypatch):
    """A folder holding a dataset, or other files, is refused before the tokenizer loads (#38 item 3): here
    the tokenizer would not load at all, and the answer is still the output folder's."""
    from wdspack.packer import samples
    from wdspack.packer.samples import SampleConfig

    def no_load(name):
        raise AssertionError(f"the tokenizer {name!r} was loaded before the output folder was checked")

    monkeypatch.setattr(samples, "load_tokenizer", no_load)
    config = SampleConfig(str(tmp_path / "not-loaded"), tokens_per_image=16, image_token="[IMG]")
    done = tmp_path / "done"
    done.mkdir()
    (done / "manifest.json").write_text("{}")
    with pytest.raises(OutputError, match="already holds a packed dataset"):
        pack_dataset(demo_sources(demo_data), done, sample_config=config, config=PackConfig(seq_len=512))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="exists and is not empty"):
        pack_dataset(demo_sources(demo_data), busy, sample_config=config, config=PackConfig(seq_len=512))
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"] and not (done / WORK_DIR).exists()
