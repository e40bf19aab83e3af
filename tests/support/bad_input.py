"""The bad-input matrix: one dataset holding one bad record per case, and a CLI run on a full disk.

``build_bad_dataset`` writes it (the reasons each record must be dropped with, the good ids);
``pack_argv`` / ``run_with_file_size_limit`` pack it in a child whose files cannot grow past a limit;
``bomb_png`` is a decompression bomb. Used by ``tests/packer/test_bad_input.py``, ``tests/test_security.py``
and ``tools/reliability.py``.
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
from PIL import Image

from tests.support import ROOT
from wdspack.format.pack import decode_pack

__all__ = ["MAX_IMAGES", "SEQ_LEN", "TOKENS_PER_IMAGE", "bomb_png", "build_bad_dataset", "check_nothing_half_written",
           "pack_argv", "png", "run_with_file_size_limit"]

SEQ_LEN, MAX_IMAGES, TOKENS_PER_IMAGE = 512, 2, 16


def png(w: int = 16, h: int = 12, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A tiny valid PNG whose header claims ``width`` × ``height`` pixels (a decompression bomb)."""
    data = bytearray(png(1, 1))
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


def _wav(path: Path, samples: int = 1600) -> None:
    """A silent 16 kHz mono WAV of ``samples`` (the standard library's writer)."""
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(b"\0\0" * samples)


def build_bad_dataset(base: Path) -> tuple[Path, Path, list[tuple[str, str]], list[str], int]:
    """Write ``base/data/data.jsonl`` and its images; return (file, image root, [(id, reason)], good ids, lines).

    The bad cases, one record each, in file order (the first is the one ``--on-error raise`` stops at).
    Ids of records whose id cannot be read are ``data.jsonl:{row}``.
    """
    data = base / "data"
    images = data / "images"
    images.mkdir(parents=True)
    (images / "good.png").write_bytes(png(seed=1))
    (images / "good2.png").write_bytes(png(seed=2))
    (images / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    whole = png(64, 64, seed=3)
    (images / "truncated.png").write_bytes(whole[: len(whole) // 2])
    (images / "bomb.png").write_bytes(bomb_png())
    outside = data / "outside.png"  # next to the image root, not inside it
    outside.write_bytes(png(seed=4))
    os.symlink(outside, images / "link.png")
    (images / "empty.mp4").write_bytes(b"")  # videos are read from the image root too
    (data / "outside.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    _wav(images / "good.wav")  # audio too: a real WAV (this matrix packs with --tokenizer, which takes no audio)
    _wav(data / "outside.wav")

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
    add(_rec("missing-video", question="<video>\nWhat happens?") | {"video": "clip.mp4"}, "missing_video")
    add(_rec("escape-video", question="<video>\nWhat happens?") | {"videos": ["../outside.mp4"]}, "video_path_escape")
    add(_rec("empty-video", question="<video>\nWhat happens?") | {"video": "empty.mp4"}, "unreadable_video")
    add(_rec("missing-audio", question="<audio>\nWhat is that sound?") | {"audios": ["a.mp3"]}, "missing_audio")
    add(_rec("escape-audio", question="<audio>\nWhat is that sound?") | {"audio": "../outside.wav"},
        "audio_path_escape")
    add(_rec("audio", question="<audio>\nWhat is that sound?") | {"audios": ["good.wav"]}, "unsupported_media")
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
