"""The whole bad-input matrix through the real packer (issue 5: reliability).

One dataset holds one bad record per case plus good records; after ``pack_dataset`` every bad
record is in ``dropped.jsonl`` with its reason, every good one in exactly one pack, and the
manifest's counts add up. ``--on-error raise`` stops at the first bad record, naming it. An
unwritable output (a full disk, simulated with ``RLIMIT_FSIZE``) is a clear error that leaves
nothing half-written under a final name.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from demo_job import read_files
from wdspack import cli
from wdspack.errors import DROP_REASONS, SampleError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import decode_pack
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import WORK_DIR, pack_dataset

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN, MAX_IMAGES, TOKENS_PER_IMAGE = 512, 2, 16


def _png(w: int = 16, h: int = 12, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A tiny valid PNG whose header claims ``width`` × ``height`` pixels (a decompression bomb)."""
    data = bytearray(_png(1, 1))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _turns(question: str = "What is it?", answer: str = "A thing.") -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def _rec(sid: str, *, image=None, question: str = "<image>\nWhat is it?", answer: str = "A thing.",
         conversations=None) -> dict:
    rec: dict = {"id": sid, "conversations": conversations if conversations is not None else
                 _turns(question if image is not None else question.replace("<image>\n", ""), answer)}
    if image is not None:
        rec["image"] = image
    return rec


def build_bad_dataset(base: Path) -> tuple[Path, Path, list[tuple[str, str]], list[str], int]:
    """Write ``base/data/data.jsonl`` and its images; return (file, image root, [(id, reason)], good ids, lines).

    The bad cases, one record each, in file order (the first is the one ``--on-error raise`` stops at).
    Ids of records whose id cannot be read are ``data.jsonl:{row}``.
    """
    data = base / "data"
    images = data / "images"
    images.mkdir(parents=True)
    (images / "good.png").write_bytes(_png(seed=1))
    (images / "good2.png").write_bytes(_png(seed=2))
    (images / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    whole = _png(64, 64, seed=3)
    (images / "truncated.png").write_bytes(whole[: len(whole) // 2])
    (images / "bomb.png").write_bytes(bomb_png())
    outside = data / "outside.png"  # next to the image root, not inside it
    outside.write_bytes(_png(seed=4))
    os.symlink(outside, images / "link.png")

    lines: list[bytes] = []
    bad: list[tuple[str, str]] = []
    good: list[str] = []

    def add(rec: dict | bytes, reason: str | None, sid: str | None = None) -> None:
        row = len(lines)
        lines.append(rec if isinstance(rec, bytes) else json.dumps(rec).encode())
        sid = sid or (rec["id"] if isinstance(rec, dict) and isinstance(rec.get("id"), str) else f"data.jsonl:{row}")
        (good.append(sid) if reason is None else bad.append((sid, reason)))

    add(_rec("missing-image", image="nope.png"), "missing_image")
    add(_rec("good-0", image="good.png"), None)
    add(_rec("corrupt-image", image="corrupt.png"), "unreadable_image")
    add(_rec("truncated-image", image="truncated.png"), "unreadable_image")
    add(_rec("bomb-image", image="bomb.png"), "image_too_large")
    add(_rec("escape-dotdot", image="../outside.png"), "image_path_escape")
    add(_rec("escape-absolute", image=str(outside)), "image_path_escape")
    add(_rec("good-symlink", image="link.png"), None)  # confined as written (hub-cache snapshots link out)
    add(_rec("video", question="<video>\nWhat happens?") | {"video": "clip.mp4"}, "unsupported_media")
    add(_rec("good-1"), None)
    add(b'{"id": "bad-json", "conversations": [{"from": "human", "value": "hi"}', "malformed_record")
    add(_rec("wrong-type-conversations", conversations="hello"), "malformed_record")
    add(_rec("wrong-type-value", conversations=[{"from": "human", "value": 17}, {"from": "gpt", "value": "x"}]),
        "malformed_record")
    add(_rec("wrong-type-image", image=17), "malformed_record")
    add({"id": 2.5, "conversations": _turns()}, "malformed_record")  # an id that is not str/int
    add(_rec("unknown-role", conversations=[{"from": "narrator", "value": "Once"}, {"from": "gpt", "value": "x"}]),
        "unknown_role")
    add(_rec("empty-conversation", conversations=[]), "empty_conversation")
    add(_rec("no-assistant", conversations=[{"from": "human", "value": "Anyone?"}]), "no_assistant_turn")
    add(_rec("more-placeholders", image=["good.png"], question="<image>\n<image>\nBoth?"), "placeholder_mismatch")
    add(_rec("more-images", image=["good.png", "good2.png"], question="<image>\nWhich?"), "placeholder_mismatch")
    add(b'{"id": "not-utf8", "conversations": [{"from": "human", "value": "caf\xe9"}, '
        b'{"from": "gpt", "value": "ok"}]}', "malformed_record")
    add(_rec("good-2", image="good2.png"), None)
    add(_rec("too-long", answer=" ".join(["word"] * 2000)), "too_long")
    add(_rec("too-many-images", image=["good.png", "good2.png", "good.png"],
             question="<image>\n<image>\n<image>\nAll three?"), "too_many_images")
    add(_rec("dup", answer="First."), None)
    add(_rec("good-3", image=["good.png", "good2.png"], question="<image>\n<image>\nTwo?"), None)
    add(_rec("dup", answer="Second."), "duplicate_id")
    add(b"[1, 2, 3]", "malformed_record")  # valid JSON, not an object
    add(_rec("good-4", answer="Yes."), None)
    path = data / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, images, bad, good, len(lines)


@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory):
    return build_bad_dataset(tmp_path_factory.mktemp("bad"))


def _config(**kw) -> PackConfig:
    # The matrix is mostly bad records on purpose: accept any drop fraction (the default 5 % would stop
    # the job, rightly, before it writes the packs these tests inspect).
    return PackConfig(**{"seq_len": SEQ_LEN, "max_images": MAX_IMAGES, "shard_max_packs": 2,
                         "records_per_partition": 7, "run": RunOptions(max_drop_fraction=1.0), **kw})


def _packed_ids(out: Path) -> list[str]:
    ids = []
    for shard in read_manifest(out).shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar.getmembers():
                ids.extend(decode_pack(tar.extractfile(m).read(), seq_len=SEQ_LEN, max_images=MAX_IMAGES).sample_ids)
    return ids


def test_every_bad_record_is_dropped_with_its_reason(bad_dataset, sample_config, tmp_path, capsys):
    path, images, bad, good, lines = bad_dataset
    # every reason but unmaskable_turn, which needs a template that rewrites earlier turns (tests/test_templates.py)
    assert {reason for _, reason in bad} == set(DROP_REASONS) - {"unmaskable_turn"}, "the matrix covers every reason"
    out = tmp_path / "ds"
    summary = pack_dataset([str(path)], out, sample_config=sample_config, config=_config(), image_root=str(images))
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    got = {}
    for d in dropped:
        assert d["id"] not in got, f"{d['id']} dropped twice"
        got[d["id"]] = d["reason"]
    with capsys.disabled():
        print("\n  id                          expected              got")
        for sid, reason in bad:
            print(f"  {sid:27s} {reason:21s} {got.get(sid, '— (not dropped)')}")
    assert got == dict(bad), "every bad record dropped once, with its reason, and nothing else"
    for d in dropped:
        assert d["detail"] and "0x7f" not in d["detail"], d  # details name the value, never an address
    packed = _packed_ids(out)
    assert sorted(packed) == sorted(good), "every good record is in exactly one pack"
    t = read_manifest(out).totals
    assert t["samples_read"] == lines == summary.samples_read
    assert t["samples_packed"] == len(packed) == len(good)
    assert t["samples_dropped"] == len(dropped) == len(bad)
    assert t["samples_read"] == t["samples_packed"] + t["samples_dropped"]
    assert sum(t["dropped_by_reason"].values()) == t["samples_dropped"]
    assert not (out / WORK_DIR).exists()


def test_the_first_duplicate_is_kept(bad_dataset, sample_config, tmp_path):
    path, images, *_ = bad_dataset
    out = tmp_path / "ds"
    pack_dataset([str(path)], out, sample_config=sample_config, config=_config(), image_root=str(images))
    from wdspack.packer.samples import get_builder

    tok = get_builder(sample_config).tokenizer
    for shard in read_manifest(out).shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar.getmembers():
                pack = decode_pack(tar.extractfile(m).read())
                starts = np.cumsum((0,) + pack.seq_lens)
                for k, sid in enumerate(pack.sample_ids):
                    if sid == "dup":
                        answer = tok.decode(pack.input_ids[starts[k]:starts[k + 1]][
                            pack.loss_mask[starts[k]:starts[k + 1]].astype(bool)].tolist())
                        assert answer.startswith("First."), answer
    from wdspack.ops.verify import verify_dataset

    assert verify_dataset(str(out)) == []  # the dropped later copy is not a packed-and-dropped conflict


def test_on_error_raise_names_the_first_bad_record(bad_dataset, sample_config, tmp_path):
    path, images, bad, *_ = bad_dataset
    with pytest.raises(SampleError) as e:
        pack_dataset([str(path)], tmp_path / "ds", sample_config=sample_config, config=_config(on_error="raise"),
                     image_root=str(images))
    first_id, first_reason = bad[0]
    assert e.value.sample_id == first_id and e.value.reason == first_reason
    assert repr(first_id) in str(e.value) and "nope.png" in str(e.value) and "--on-error skip" in str(e.value)


@pytest.mark.parametrize("keep, reason", [
    (("good-1", "too-long"), "too_long"),
    (("good-1", "dup"), "duplicate_id"),
    (("good-1", "not-utf8"), "malformed_record"),
])
def test_on_error_raise_for_budget_and_duplicate_drops(bad_dataset, sample_config, tmp_path, keep, reason):
    """Budgets and duplicates are found after measuring; ``raise`` still names the record."""
    path, images, *_ = bad_dataset
    src = tmp_path / "some.jsonl"
    src.write_bytes(b"".join(line + b"\n" for line in path.read_bytes().splitlines()
                             if any(f'"id": "{k}"'.encode() in line for k in keep)))
    with pytest.raises(SampleError) as e:
        pack_dataset([str(src)], tmp_path / "ds", sample_config=sample_config, config=_config(on_error="raise"),
                     image_root=str(images))
    assert e.value.reason == reason
    assert e.value.sample_id in (*keep, "some.jsonl:1") and repr(e.value.sample_id) in str(e.value)


def test_cli_on_error_raise_is_one_line_exit_1(bad_dataset, tekken_dir, tmp_path, capsys):
    path, images, *_ = bad_dataset
    code = cli.main(["pack", str(path), "--output", str(tmp_path / "ds"), "--tokenizer", str(tekken_dir),
                     "--chat-template", str(ROOT / "examples" / "chat_templates" / "pixtral.jinja"),
                     "--image-token", "[IMG]", "--tokens-per-image", str(TOKENS_PER_IMAGE), "--seq-len",
                     str(SEQ_LEN), "--max-images", str(MAX_IMAGES), "--image-root", str(images),
                     "--on-error", "raise", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and err.startswith("wdspack pack: error: sample 'missing-image'"), err


# -- an output that cannot be written ----------------------------------------------------------------

_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from wdspack import cli
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.exit(cli.main(sys.argv[2:]))
""")


def pack_argv(sources: list[str], out: Path, tekken_dir: Path, image_root: Path | None = None) -> list[str]:
    argv = ["pack", *sources, "--output", str(out), "--tokenizer", str(tekken_dir), "--chat-template",
            str(ROOT / "examples" / "chat_templates" / "pixtral.jinja"), "--image-token", "[IMG]",
            "--tokens-per-image", str(TOKENS_PER_IMAGE), "--seq-len", str(SEQ_LEN), "--max-images",
            str(MAX_IMAGES), "--shard-packs", "2", "--max-drop-fraction", "1", "--quiet"]  # mostly bad records
    return argv + (["--image-root", str(image_root)] if image_root else [])


def run_with_file_size_limit(limit: int, argv: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI in a child whose files cannot grow past ``limit`` bytes (a full disk)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", _FULL_DISK, str(limit), *argv], env=env, capture_output=True,
                          text=True, timeout=120)


def check_nothing_half_written(out: Path) -> None:
    """No manifest, and every shard under a final name decodes completely."""
    assert not (out / "manifest.json").exists()
    for shard in out.glob("*.tar"):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                decode_pack(tar.extractfile(m).read())


@pytest.mark.slow  # CLI processes
def test_full_disk_is_a_clear_error_and_leaves_nothing_half_written(bad_dataset, tekken_dir, tmp_path):
    path, images, *_ = bad_dataset
    out = tmp_path / "ds"
    done = run_with_file_size_limit(3000, pack_argv([str(path)], out, tekken_dir, images))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("wdspack pack: error: cannot write") and "File too large" in lines[0], lines[0]
    assert "--resume" in lines[0]
    check_nothing_half_written(out)
    # with room again, --resume finishes the job: the same result as a run that never failed
    assert cli.main(pack_argv([str(path)], out, tekken_dir, images) + ["--resume"]) == 0
    reference = tmp_path / "reference"
    assert cli.main(pack_argv([str(path)], reference, tekken_dir, images)) == 0
    assert read_files(out) == read_files(reference)


def test_unwritable_output_is_a_clear_error(bad_dataset, tekken_dir, tmp_path, capsys):
    path, images, *_ = bad_dataset
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    code = cli.main(pack_argv([str(path)], blocker / "ds", tekken_dir, images))
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.count("\n") == 0 and "cannot create" in err, err
