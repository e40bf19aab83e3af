"""Bad videos lose nothing (issue #40, item 5), through the user's commands: ``wdspack pack`` drops what a
container's header and its packets show, a file cut short included (issue #47), each with its own reason naming
the file (in ``dropped.jsonl``, counted in the command's summary, in one line under ``--on-error raise``); in a
dataset packed before that check, ``wdspack verify`` names each such video and ``make_loader`` drops its sample
from the pack, counted, and streams the rest. A variable frame rate and a rotation flag are handled: the planned
frames decode to the frames transformers' own PyAV decoding gives. Decoding is bounded in seconds and in pixels
per video.

Every clip is tiny, made once with PyAV; the hostile ones are real clips with a header field rewritten.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import tracemalloc
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import wdspack
from wdspack import cli
from wdspack.errors import SampleError
from wdspack.media.video import header as video_header
from wdspack.media.video import pixels as vp
from wdspack.media.video import plan as video
from wdspack.media.video.plan import (
    MAX_PLAN_FRAMES,
    QwenVideoSampling,
    VideoHeader,
    plan_qwen2_vl,
    plan_qwen3_vl,
    read_header,
)
from wdspack.media.video.record import MAX_VIDEO_FRAMES
from wdspack.models import save_processor
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN, FPS, MAX_FRAMES, PIXELS = 64, 4.0, 8, 28 * 28 * 4  # seq_len: one video chat a pack
ASK = "<video>What happens?"


def _clip(path: Path, *, frames: int = 24, width: int = 48, height: int = 32, rate: Fraction = Fraction(12),
          options: dict | None = None, pts: list[int] | None = None, codec: str = "h264") -> bytes:
    """An h264 clip (``pts`` in milliseconds: a variable frame rate); ``options`` for the muxer."""
    with av.open(str(path), "w", options=options or {}) as out:
        fast = {"deadline": "realtime", "cpu-used": "8"} if codec == "libvpx-vp9" else None
        stream = out.add_stream(codec, rate=rate, options=fast)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if pts is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        rng = np.random.default_rng(frames)
        for k in range(frames):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            pixels[:, : (k * 3) % width] = 255
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            if pts is not None:
                frame.pts, frame.time_base = pts[k], Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path.read_bytes()


def _aac_only(path: Path) -> None:
    """An MP4 holding one AAC audio stream and no video (what an .m4a is)."""
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000)
        for k in range(8):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, k * 1024
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _huge_avi(path: Path) -> None:
    """A real raw-video AVI whose headers claim 10000x10000 frames (1e8 pixels: over the 64e6 bomb guard)."""
    tmp = path.with_suffix(".tmp.avi")
    with av.open(str(tmp), "w") as out:
        stream = out.add_stream("rawvideo", rate=12)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        for _ in range(4):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((32, 48, 3), np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    data = bytearray(tmp.read_bytes())
    tmp.unlink()
    struct.pack_into("<ii", data, data.find(b"strf") + 12, 10_000, 10_000)  # BITMAPINFOHEADER biWidth, biHeight
    struct.pack_into("<II", data, data.find(b"avih") + 40, 10_000, 10_000)  # MainAVIHeader dwWidth, dwHeight
    path.write_bytes(bytes(data))


def _claim_frames(mp4: bytes, frames: int) -> bytes:
    """The MP4 with its one ``stts`` entry claiming ``frames`` samples (its header then says so)."""
    data = bytearray(mp4)
    at = data.find(b"stts")
    assert struct.unpack_from(">I", data, at + 8)[0] == 1, "one stts entry"
    struct.pack_into(">I", data, at + 12, frames)
    return bytes(data)


def _rotate_90(mp4: bytes) -> bytes:
    """The MP4 with the video track's display matrix turned 90° (what phones write)."""
    data = bytearray(mp4)
    # after 'tkhd': version/flags; created, modified, track id, reserved, duration; reserved[2]; layer, group,
    # volume, reserved (version 0): then the 3x3 matrix
    at = data.find(b"tkhd") + 4 + 4 + 4 * 5 + 8 + 2 * 4
    struct.pack_into(">9i", data, at, 0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000)
    return bytes(data)


def _row(sid: str, video: str | None, ask: str = ASK) -> dict:
    row: dict = {"id": sid, "messages": [{"role": "user", "content": ask if video else "Say hi."},
                                         {"role": "assistant", "content": "Colours change."}]}
    return row | ({"videos": [video]} if video else {})


#: what the user reads of a faststart MP4 (its header first) whose data was cut: ``{}`` the header's frames
CUT = r"the header gives {} frames but the file holds the data of \d+ \(the file was cut short: download it again\)"
#: id -> (file, reason, a pattern the detail holds): dropped at pack time from the header and the packets (or the
#: sources)
AT_PACK = {
    "head-gone": ("clips/head_gone.mp4", "unreadable_video", "Invalid data"),
    "empty": ("clips/empty.mp4", "unreadable_video", re.escape("empty (0 bytes)")),
    "audio-only": ("clips/voice.m4a", "unreadable_video", "no video stream"),
    "garbage": ("clips/garbage.mp4", "unreadable_video", "cannot read the video's header"),
    "huge-frames": ("clips/huge.avi", "video_too_large", "10000x10000 = 100000000 pixels a frame > the limit"),
    "one-frame": ("clips/one.mp4", "video_too_short",
                  re.escape("1 frame(s): the processor samples frames in temporal patches")),
    "escape": ("../outside.mp4", "video_path_escape", "outside.mp4"),
    "decodes-too-much": ("clips/big.mp4", "video_too_large", "8 frames of 96x64 = 49152 pixels to decode > the 20000"),
    # the frames' data is not all in the file (issue #47): an interrupted download, a header that lies
    "cut-60": ("clips/cut60.mp4", "unreadable_video", CUT.format(24)),
    "cut-30kb": ("clips/cut30k.mp4", "unreadable_video", CUT.format(96)),
    "cut-tail": ("clips/cut.mp4", "unreadable_video", CUT.format(24)),
    "cut-webm": ("clips/cut.webm", "unreadable_video", r"the header gives 4\.00 s but the file holds the data of \d+ "
                 r"frames, [\d.]+ s \(the file was cut short: download it again\)"),
    "lying-stts": ("clips/lying.mp4", "unreadable_video", re.escape(
        "the header gives 3000000000 frames but the file holds the data of 24 (the file was cut short, or its header "
        "is wrong: download it again)")),
}
#: frames × pixels the loader decodes of one video, lowered for the pack job: good.mp4's 8 frames of 48x32 fit
DECODE_PIXELS = 20_000
#: id -> file: dropped now; packed by a wdspack that did not check the frames' data (the ``older`` dataset), named
#: by ``verify`` and dropped from its pack at load time (decoding shows it)
AT_LOAD = {"lying-stts": "clips/lying.mp4", "cut-tail": "clips/cut.mp4"}
GOOD = {"good-0": "clips/good.mp4", "text": None, "good-1": "clips/good.mp4"}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """The source folder: ``chats.jsonl`` (one record per case, good ones between) and its ``clips/``."""
    root = tmp_path_factory.mktemp("video-bad")
    clips = root / "src" / "clips"
    clips.mkdir(parents=True)
    good = _clip(clips / "good.mp4")
    front = _clip(root / "front.mp4", options={"movflags": "faststart"})  # the moov (header) before the frames
    assert front.find(b"moov") < front.find(b"mdat")
    (clips / "head_gone.mp4").write_bytes(front[:30])
    (clips / "empty.mp4").write_bytes(b"")
    _aac_only(clips / "voice.m4a")
    (clips / "garbage.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    _huge_avi(clips / "huge.avi")
    _clip(clips / "one.mp4", frames=1)
    _clip(clips / "big.mp4", frames=40, width=96, height=64)
    (root / "outside.mp4").write_bytes(good)
    (clips / "lying.mp4").write_bytes(_claim_frames(front, 3_000_000_000))
    (clips / "cut.mp4").write_bytes(front[: front.find(b"mdat") + (len(front) - front.find(b"mdat")) // 2])
    (clips / "cut60.mp4").write_bytes(front[: len(front) * 6 // 10])
    longer = _clip(root / "longer.mp4", frames=96, options={"movflags": "faststart"})
    assert len(longer) > 45_000 and longer.find(b"mdat") < 2_000, "30 KB is a cut after the header"
    (clips / "cut30k.mp4").write_bytes(longer[:30_000])
    webm = _clip(root / "whole.webm", frames=48, codec="libvpx-vp9")  # 4 s
    (clips / "cut.webm").write_bytes(webm[: len(webm) * 6 // 10])
    rows = [_row(sid, f) for sid, (f, _, _) in AT_PACK.items()]
    rows[3:3] = [_row(sid, f) for sid, f in GOOD.items()]
    (root / "src" / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    older = [_row(sid, f) for sid, f in {**GOOD, **AT_LOAD}.items()]
    (root / "src" / "older.jsonl").write_text("".join(json.dumps(r) + "\n" for r in older))
    return root / "src"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> tuple:
    """The tiny Qwen2.5-VL processor (real classes), saved as a folder, and the processor itself."""
    from tiny_vlm import qwen2_5_vl

    root = tmp_path_factory.mktemp("qwen")
    processor = qwen2_5_vl.processor(root / "tok")
    return save_processor(processor, root / "processor"), processor


def _pack(src: Path, processor: Path, source: str, out: Path, *, check_data: bool = True) -> tuple[int, str]:
    """``wdspack pack`` on ``src / source`` as a user runs it: (exit code, what it printed). Without
    ``check_data``, as wdspack packed before it checked that a file holds its frames' data (issue #47)."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said), pytest.MonkeyPatch.context() as mp:
        mp.setattr(video, "MAX_VIDEO_PIXELS", DECODE_PIXELS)
        if not check_data:
            mp.setattr(video_header, "_check_held", lambda *args, **kwargs: None)
        code = cli.main(["pack", str(src / source), "--output", str(out), "--processor", str(processor),
                         "--image-root", str(src), "--video-fps", str(FPS), "--video-max-frames", str(MAX_FRAMES),
                         "--video-max-pixels", str(PIXELS), "--seq-len", str(SEQ_LEN), "--max-drop-fraction", "1"])
    return code, said.getvalue()


@pytest.fixture(scope="module")
def packed(src, qwen) -> tuple[Path, int, str]:
    """``wdspack pack`` on the sources as a user runs it: (output folder, exit code, what it printed)."""
    out = src.parent / "packed"
    return (out, *_pack(src, qwen[0], "chats.jsonl", out))


@pytest.fixture(scope="module")
def older(src, qwen) -> Path:
    """The good records and :data:`AT_LOAD`'s packed as wdspack packed them before issue #47 (no check that a
    file holds its frames' data): what ``verify`` and the loader meet in a dataset packed then."""
    out = src.parent / "older"
    code, said = _pack(src, qwen[0], "older.jsonl", out, check_data=False)
    assert code == 0 and "dropped 0" in said, said
    return out


def _dropped(out: Path) -> dict[str, dict]:
    return {d["id"]: d for d in map(json.loads, (out / "dropped.jsonl").read_text().splitlines())}


def test_what_the_header_shows_is_dropped_with_its_own_reason_naming_the_file(packed):
    out, code, said = packed
    assert code == 0, said
    dropped = _dropped(out)
    assert set(dropped) == set(AT_PACK), "exactly the header's and the packets' cases dropped"
    for sid, (path, reason, words) in AT_PACK.items():
        d = dropped[sid]
        assert d["reason"] == reason and re.search(words, d["detail"]), d
        assert Path(path).name in d["detail"], f"{sid}: the detail names the file: {d['detail']}"
        assert "\n" not in d["detail"] and "<none>" not in d["detail"] and "Traceback" not in d["detail"]
    assert "Traceback" not in said
    summary = next(line for line in said.splitlines() if line.startswith("samples"))
    assert "dropped 13 (unreadable_video 9, video_path_escape 1, video_too_large 2, video_too_short 1)" in summary


@pytest.mark.parametrize("sid, says", [
    ("escape", r"sample 'escape': video path '\.\./outside\.mp4' resolves to .* \[video_path_escape\]"),
    ("cut-60", r"sample 'cut-60': video 0 \('clips/cut60\.mp4'\): " + CUT.format(24)
     + r" \(pass --on-error skip to drop such samples and go on\) \[unreadable_video\]"),
], ids=["escape", "cut-60"])
def test_on_error_raise_says_what_is_wrong_with_the_video_in_one_line(src, qwen, tmp_path, capsys, sid, says):
    (tmp_path / "one.jsonl").write_text(json.dumps(_row(sid, AT_PACK[sid][0])) + "\n")
    code = cli.main(["pack", str(tmp_path / "one.jsonl"), "--output", str(tmp_path / "out"), "--processor",
                     str(qwen[0]), "--image-root", str(src), "--video-fps", str(FPS), "--seq-len", str(SEQ_LEN),
                     "--on-error", "raise", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert re.fullmatch("wdspack pack: error: " + says, err), err


@pytest.mark.parametrize("mode", ["tokenizer", "gemma3"])
def test_a_video_without_a_video_path_is_unsupported_media_naming_the_families(src, tekken_dir, pixtral_template,
                                                                               tmp_path, mode):
    """With ``--tokenizer`` (no video layout) and with a family that has no video path (Gemma 3)."""
    if mode == "tokenizer":
        sample_config = SampleConfig(tokenizer=str(tekken_dir), chat_template=pixtral_template, tokens_per_image=16,
                                     image_token="[IMG]")
    else:
        from tiny_vlm import gemma3

        sample_config = SampleConfig(processor=str(save_processor(gemma3.processor(tmp_path / "tok"),
                                                                  tmp_path / "processor")))
    out = tmp_path / "out"
    pack_dataset([str(src / "chats.jsonl")], out, sample_config=sample_config, image_root=str(src), progress=False,
                 config=PackConfig(seq_len=512, run=RunOptions(max_drop_fraction=1.0)))
    dropped = _dropped(out)
    for sid in ("good-0", "good-1", *AT_LOAD):  # the readable ones: refused before their header is read
        d = dropped[sid]
        assert d["reason"] == "unsupported_media", d
        assert "families with one: " in d["detail"] and "qwen2_5_vl" in d["detail"] and "qwen3_vl" in d["detail"], d
    assert ("videos need --processor" if mode == "tokenizer" else "the gemma3 family has no video path") \
        in dropped["good-0"]["detail"]
    assert "text" not in dropped


def _packs(out: Path) -> list:
    import tarfile

    from wdspack.format.pack import decode_pack

    packs = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            packs += [decode_pack(tar.extractfile(m).read()) for m in tar.getmembers()]
    return packs


def test_a_header_that_lies_and_a_cut_tail_packed_before_the_check_are_dropped_at_load_and_the_rest_streams(older,
                                                                                                           qwen):
    """In a dataset packed before the pack job checked the frames' data, only decoding shows these: the loader
    drops each such sample from its pack, counted with its reason, and every other pack streams whole."""
    packs = _packs(older)
    lying = [p for p in packs if set(p.sample_ids) & set(AT_LOAD)]
    good = [p for p in packs if not set(p.sample_ids) & set(AT_LOAD)]
    assert len(lying) == 2 and {sid for p in good for sid in p.sample_ids} == set(GOOD)
    (claimed,) = [p.video_plans[0] for p in lying if "lying-stts" in p.sample_ids]
    assert len(claimed.frames) == MAX_FRAMES and claimed.frames[-1] > 10**9, "planned from the claimed 3e9 frames"
    loader = wdspack.make_loader(str(older), batch_size=1, num_workers=0, shuffle=False, processor=qwen[1])
    batches = list(loader)
    assert len(batches) == len(packs), "the epoch keeps its fixed length"
    assert loader.stats["dropped_samples"] == 2 and loader.stats["dropped_samples/older/unreadable_video"] == 2, \
        loader.stats
    got = {tuple(b["input_ids"][0][: int(b["num_tokens"][0])].tolist()) for b in batches}
    assert got - {()} == {tuple(p.input_ids.tolist()) for p in good}, "every other pack streams, whole"
    assert any(bool(b["video_mask"].any()) for b in batches), "with its video's pixels"


def test_each_corrupt_video_is_one_line_naming_the_sample_and_the_video(older, qwen, caplog):
    """Skipped, each is warned in one line naming its sample and video; ``on_corrupt="raise"`` stops at the
    first with that line."""
    with caplog.at_level("WARNING", logger="wdspack"):
        list(wdspack.make_loader(str(older), batch_size=1, num_workers=0, shuffle=False, processor=qwen[1]))
    said = [r.getMessage() for r in caplog.records if "dropped_samples" in r.getMessage()]
    assert {sid for sid in AT_LOAD for m in said if f"sample {sid!r}: video 0: frame " in m} == set(AT_LOAD), said
    for message in said:
        assert "\n" not in message and "asked for, but the video has" in message, message
    lying = "sample 'lying-stts': video 0: frame 375000000 asked for, but the video has 24 frames"
    assert lying in said[0], "the claimed frames against the real"
    loader = wdspack.make_loader(str(older), batch_size=1, num_workers=0, shuffle=False, processor=qwen[1],
                                 on_corrupt="raise")
    with pytest.raises(wdspack.FormatError) as e:
        list(loader)
    assert "\n" not in str(e.value) and lying in str(e.value), (str(e.value), said)


def test_verify_names_each_video_cut_short_in_a_dataset_packed_before_the_check(older, packed, src, capsys):
    """``wdspack verify`` runs the pack job's check on every packed video against the frames its plan names,
    so a dataset packed before it (or a clip damaged since) is reported: the shard, the pack, the sample, the
    video and the reason, one line each. A pack holds each video's bytes, so ``--source`` finds the same; the
    dataset packed with the check (the cut clips dropped) checks out, with ``--source`` too."""
    problems = verify_dataset(str(older))
    assert len(problems) == len(AT_LOAD), problems
    found = {}
    for line in problems:
        m = re.fullmatch(r"([\w-]+\.tar): pack (\w+): sample '([\w-]+)': video 0: (.*) \[unreadable_video\]", line)
        assert m, line
        found[m[3]] = m[4]
    assert set(found) == set(AT_LOAD), problems
    assert re.fullmatch(CUT.format(24), found["cut-tail"]), found
    assert re.fullmatch(AT_PACK["lying-stts"][2], found["lying-stts"]), found
    assert verify_dataset(str(older), sources=[str(src / "older.jsonl")], image_root=str(src)) == problems
    code = cli.main(["verify", str(older), "--source", str(src / "older.jsonl"), "--image-root", str(src)])
    said = capsys.readouterr()
    assert code == 1 and said.out.splitlines() == [f"FAIL {line}" for line in problems], said
    assert said.err.strip() == f"2 problems in {older}", said.err
    assert verify_dataset(str(packed[0])) == []
    assert verify_dataset(str(packed[0]), sources=[str(src / "chats.jsonl")], image_root=str(src)) == []
    good = (src / "clips" / "good.mp4").read_bytes()  # whole, but not the clip a plan was made from
    assert video.check_planned_frames(good, range(24)).frames == 24
    with pytest.raises(SampleError, match=r"^sample 's': the plan names frame 24 but the file holds the data of 24 "
                                          r"frames \(the video is not the one planned, or was cut short: pack the "
                                          r"sample again from a whole copy\) \[unreadable_video\]$"):
        video.check_planned_frames(good, [0, 24], sample_id="s")


def test_variable_frame_rate_and_rotation_decode_to_the_processors_frames(tmp_path):
    """transformers' PyAV decoding (``read_video_pyav``) takes frames in decoding order and ignores a rotation
    flag; the plan from the header (frames, average rate) names the same frames and ``decode_frames`` gives
    them bit for bit: handled, as the processor handles them."""
    from transformers.video_utils import read_video_pyav

    vfr = tmp_path / "vfr.mp4"
    pts = [0, 40, 60, 200, 210, 220, 500, 530, 700, 900, 905, 1300, 1320, 1500, 1800, 1810, 2000, 2400]
    _clip(vfr, frames=len(pts), pts=pts)
    rotated = tmp_path / "rotated.mp4"
    rotated.write_bytes(_rotate_90(_clip(tmp_path / "upright.mp4", frames=16, width=64, height=32)))
    with av.open(str(vfr)) as c:
        deltas = np.diff([f.pts for f in c.decode(video=0)])
        assert len(set(deltas.tolist())) > 3, "the frame rate varies"
    with av.open(str(rotated)) as c:
        assert next(c.decode(video=0)).rotation == -90, "the flag is there, and PyAV reads it"
    sampling = QwenVideoSampling(do_sample_frames=True, fps=FPS, min_frames=2, max_pixels=PIXELS, min_pixels=PIXELS)
    for path in (vfr, rotated):
        data = path.read_bytes()
        header = read_header(data)
        plan = plan_qwen2_vl(header, sampling)
        mine = vp.decode_frames(data, plan.indices)
        theirs, meta = read_video_pyav(str(path), sample_indices_fn=lambda metadata, _i=plan.indices, **_: list(_i))
        assert (meta.total_num_frames, meta.fps) == (header.frames, header.fps), "the header is the processor's"
        assert mine.shape == theirs.shape and np.array_equal(mine, theirs), path.name
        assert mine.shape[1:3] == (header.height, header.width), "not rotated, as the processor does not rotate"


def test_a_slow_decode_stops_at_max_seconds_in_one_line(packed, qwen, monkeypatch):
    out, _, _ = packed
    monkeypatch.setattr(vp, "MAX_DECODE_SECONDS", 0.0)
    loader = wdspack.make_loader(str(out), batch_size=1, num_workers=0, shuffle=False, processor=qwen[1],
                                 on_corrupt="raise")
    with pytest.raises(wdspack.FormatError) as e:
        list(loader)
    message = str(e.value)
    assert "\n" not in message, message
    assert re.search(r"sample '[\w-]+': video 0: decoding stopped after 0 s \(max_seconds\) with \d+ frames", message)


def test_frames_times_pixels_of_one_video_are_bounded(src, monkeypatch):
    data = (src / "clips" / "good.mp4").read_bytes()
    with pytest.raises(vp.VideoDecodeError, match=r"^8 frames of 48x32 = 12288 pixels > max_video_pixels 12287; "):
        vp.decode_frames(data, range(8), max_video_pixels=8 * 48 * 32 - 1)
    assert vp.decode_frames(data, range(8), max_video_pixels=8 * 48 * 32).shape == (8, 32, 48, 3)
    monkeypatch.setattr(vp, "MAX_VIDEO_PIXELS", 100)  # the default, read at each call
    with pytest.raises(vp.VideoDecodeError, match="max_video_pixels 100;"):
        vp.decode_frames(data, [0])


def test_counting_a_webms_frames_is_bounded_in_frames_and_seconds(tmp_path, monkeypatch):
    """A container without a frame count has its packets counted, within a count and a time limit: past
    either the video is ``video_too_large`` with the fix, not a probe that runs for as long as the file. An MP4's
    pass (its frames' data checked) stops at its header's count and is bounded in time the same way."""
    data = _clip(tmp_path / "c.mkv", frames=8)  # Matroska, as WebM: no frame count in the header
    assert video.read_header(data).frames == 8
    monkeypatch.setattr(video_header, "MAX_COUNTED_FRAMES", 7)
    with pytest.raises(SampleError, match=r"^sample 's': over 7 frames counted \(its container gives no count\); "
                                          r"split the video into shorter clips \[video_too_large\]$"):
        video.read_header(data, sample_id="s")
    monkeypatch.setattr(video_header, "MAX_COUNTED_FRAMES", 8)
    assert video.read_header(data).frames == 8
    monkeypatch.setattr(video_header, "MAX_COUNT_SECONDS", -1.0)
    with pytest.raises(SampleError, match=r"took over -1 s at 1 frames; split the video or remux it as MP4") as e:
        video.read_header(data)
    assert e.value.reason == "video_too_large"
    mp4 = _clip(tmp_path / "c.mp4", frames=8)  # a frame count in the header: its frames' data is checked, in time
    with pytest.raises(SampleError, match=r"^sample '': checking the data of the 8 frames its header gives took over "
                                          r"-1 s at 1 frames; split the video \[video_too_large\]$"):
        video.read_header(mp4)


def test_a_webm_cut_short_is_found_against_its_tracks_duration_or_else_the_containers(tmp_path):
    """WebM gives no frame count: the packets counted must reach the duration its header gives, the video
    track's own (the ``DURATION`` tag FFmpeg and mkvmerge write) or, without one, the container's (with a second
    more of slack: another track may run longer)."""
    whole = _clip(tmp_path / "v.webm", frames=60, rate=Fraction(10), codec="libvpx-vp9")  # 6 s
    untagged = whole.replace(b"DURATION", b"DURATIOX")  # the tag's name, same length: the track gives no duration
    assert whole.count(b"DURATION") == 1 and untagged != whole
    with av.open(io.BytesIO(untagged)) as c:
        assert "DURATION" not in c.streams.video[0].metadata and c.duration == 6_000_000
    for data in (whole, untagged):
        assert read_header(data).frames == 60
        with pytest.raises(SampleError, match=r"^sample 'w': the header gives 6\.00 s but the file holds the data of "
                                              r"\d+ frames, [\d.]+ s \(the file was cut short: download it again\) "
                                              r"\[unreadable_video\]$"):
            read_header(data[: len(data) // 2], sample_id="w")


def test_a_header_claiming_billions_of_frames_plans_in_bounded_memory():
    """Sampled, the plan holds at most max_frames frames and allocates nothing per claimed frame; a
    processor that takes every frame is refused over what a plan may name (``video_too_large``)."""
    header = VideoHeader(frames=3_000_000_000, fps=30.0, width=64, height=48)
    tracemalloc.start()
    try:
        plans = [plan_qwen2_vl(header, QwenVideoSampling(do_sample_frames=True, fps=2.0, max_frames=64)),
                 plan_qwen3_vl(header, QwenVideoSampling(do_sample_frames=True, fps=2.0, max_frames=64,
                                                         patch_size=16))]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(p.indices) for p in plans] == [64, 64] and peak < 1 << 20, peak
    assert MAX_PLAN_FRAMES == MAX_VIDEO_FRAMES, "the planner's bound is the pack format's"
    for plan in (plan_qwen2_vl, plan_qwen3_vl):
        with pytest.raises(SampleError, match=r"3000000000 frames .* > the 4096 a plan may name; pass --video-fps"):
            plan(header, QwenVideoSampling(do_sample_frames=False))


@pytest.mark.parametrize("change, words", [
    ({"size": (30_000, 30_000)}, "resizes 8 frames to 30000x30000: over 2147483648 pixels a video"),
    ({"tokens": 10_000}, "the videos take 10000 tokens of a pack of 64"),
    ({"second_per_grid_t": float("nan")}, "nan seconds per temporal patch"),
])
def test_an_untrusted_pack_cannot_make_the_loader_allocate_for_its_video(change, words):
    """A pack's video plan is checked as it is decoded (``validate_pack``), before any frame is decoded or
    resized; 0 seconds per temporal patch (LLaVA-OneVision's plans, which have no time axis) is valid."""
    from dataclasses import replace

    from wdspack.format.pack import Pack, decode_pack, encode_pack, validate_pack
    from wdspack.media.video.record import VideoPlanRecord

    plan = VideoPlanRecord(tuple(range(0, 16, 2)), (56, 84), (4, 4, 6), 0.5)
    good = Pack(np.arange(64, dtype=np.uint32), np.ones(64, np.uint8), (64,), ("v",), videos=(b"\0" * 16,),
                video_sample=(0,), video_tokens=(24,), video_plans=(plan,))
    assert decode_pack(encode_pack(good, token_dtype="<u2")).video_plans == (plan,)
    validate_pack(replace(good, video_plans=(replace(plan, second_per_grid_t=0.0),)))
    tokens = change.pop("tokens", None)
    bad = replace(good, video_plans=(replace(plan, **change),), video_tokens=(tokens or 24,))
    with pytest.raises(wdspack.FormatError, match=re.escape(words)):
        validate_pack(bad)
