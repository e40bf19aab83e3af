"""A video's pixels as the loader makes them (issue #40): only the planned frames decoded, by seeking
or decoding on, exactly the frames a plain decode gives; bounded, with one-line errors; resized,
patchified and normalised bit for bit as the real ``Qwen2VLVideoProcessor`` and
``Qwen3VLVideoProcessor`` do (``torch.equal``), on clips made here with PyAV: h264 MP4 at 30000/1001
fps of an odd size, h264 with B-frames and a long keyframe interval, VP9 WebM whose header has no
frame count. The processors run in one process of their own (``tests/support/video_reference.py``);
the tests that need it are marked slow."""

from __future__ import annotations

import pickle
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.video_reference import processor_job, run_jobs, video_processor_job
from wdspack.errors import FormatError, SampleError
from wdspack.media.video import pixels as video_pixels
from wdspack.media.video.pixels import (
    VideoDecodeError,
    decode_frames,
    normalize_video_rows,
    qwen_video_patches,
    resize_frames,
)
from wdspack.media.video.plan import (
    QWEN3_VL_VIDEO,
    QwenVideoSampling,
    plan_qwen2_vl,
    plan_qwen3_vl,
    qwen3_vl_prompt,
    read_header,
)

av = pytest.importorskip("av")

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]


def _clip(path: Path, *, codec: str, rate: Fraction, frames: int, width: int, height: int, pix_fmt: str = "yuv420p",
          options: dict[str, str] | None = None, container: dict[str, str] | None = None) -> Path:
    """A small real clip: moving bars over a colour that changes each frame, and a noisy band (so each
    frame differs and the resize has edges to smooth)."""
    rng = np.random.default_rng(7)
    with av.open(str(path), "w", options=container or {}) as out:
        stream = out.add_stream(codec, rate=rate, options=options or {})
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        for k in range(frames):
            pixels = np.full((height, width, 3), ((k * 7) % 256, (k * 13) % 256, 90), np.uint8)
            pixels[:, : (k % width)] = 255
            pixels[(k * 3) % height:, -6:] = rng.integers(0, 256, (height - (k * 3) % height, 6, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    long_gop = "keyint=30:min-keyint=30:scenecut=0:bframes=3:b-pyramid=normal:open-gop=1"
    return {
        # odd width and height: 4:4:4 (x264's 4:2:0 wants even sides)
        "mp4": _clip(folder / "odd.mp4", codec="h264", rate=Fraction(30000, 1001), frames=47, width=67, height=51,
                     pix_fmt="yuv444p"),
        "gop": _clip(folder / "gop.mp4", codec="h264", rate=Fraction(25), frames=90, width=64, height=48,
                     options={"x264-params": long_gop}, container={"movflags": "faststart"}),
        "webm": _clip(folder / "clip.webm", codec="libvpx-vp9", rate=Fraction(24), frames=31, width=64, height=36,
                      options={"g": "8"}),
    }


def _all_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_torchvision_stays_out_of_the_packages_environment():
    # importable here, transformers would pick torchvision backends for every image processor
    import importlib.util

    assert importlib.util.find_spec("torchvision") is None


def test_the_clips_have_what_the_seek_tests_need(clips):
    for name, keyframes in (("gop", [0, 30, 60]), ("webm", [0, 8, 16, 24])):
        with av.open(str(clips[name])) as container:
            stream = container.streams.video[0]
            packets = [p for p in container.demux(stream) if p.size]
        assert [i for i, p in enumerate(packets) if p.is_keyframe] == keyframes
        if name == "gop":  # B-frames: packets out of presentation order
            assert [p.pts for p in packets] != sorted(p.pts for p in packets)
    assert read_header(clips["webm"]).frames == 31  # counted: the header says 0


@pytest.mark.parametrize("name", ["gop", "webm", "mp4"])
def test_seeking_gives_exactly_the_frames_decoding_from_the_start_gives(clips, name, monkeypatch):
    data, every = clips[name].read_bytes(), _all_frames(clips[name])
    ways = {"sequential": 0, "seeking": 0}
    sequential, seeking = video_pixels._decode_sequential, video_pixels._decode_seeking

    def count(way, fn):
        def call(*args, **kwargs):
            ways[way] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(video_pixels, "_decode_sequential", count("sequential", sequential))
    monkeypatch.setattr(video_pixels, "_decode_seeking", count("seeking", seeking))
    n = len(every)
    cases = [[0], [n - 1], [5, 5, 6, n - 2], [0, 1, 2, n - 1], list(range(0, n, 7)), [n // 2, n // 2 + 1]]
    rng = np.random.default_rng(3)
    cases += [sorted(rng.integers(0, n, rng.integers(1, 9)).tolist()) for _ in range(6)]
    for gap in (0, video_pixels.SEEK_MIN_FRAMES):  # 0: seek wherever a keyframe lies ahead
        monkeypatch.setattr(video_pixels, "SEEK_MIN_FRAMES", gap)
        for indices in cases:
            got = decode_frames(data, indices)
            assert got.dtype == np.uint8 and np.array_equal(got, every[indices]), (gap, indices)
        if gap == 0:  # every case took the seeking path, and none fell back to decoding from the start
            assert ways == {"sequential": 0, "seeking": len(cases)}
    if name in ("gop", "webm"):  # the default threshold seeks to the last keyframe for the last frame
        with monkeypatch.context() as m:
            m.setattr(video_pixels, "_decode_sequential", None)  # would fail if called
            assert np.array_equal(decode_frames(data, [n - 1]), every[[n - 1]])


def test_bounds_are_checked_before_decoding(clips):
    data = clips["mp4"].read_bytes()
    with pytest.raises(VideoDecodeError, match=r"a 67x51 video has 3417 pixels a frame > max_pixels 3000; raise"):
        decode_frames(data, [0], max_pixels=3000)
    with pytest.raises(VideoDecodeError, match=r"5 frames asked for > max_frames 4; raise max_frames"):
        decode_frames(data, [0, 1, 2, 3, 4], max_frames=4)
    with pytest.raises(VideoDecodeError, match=r"decoding stopped after 0 s \(max_seconds\)"):
        decode_frames(data, [0, 40], max_seconds=0)
    assert decode_frames(data, []).shape == (0, 51, 67, 3)


def test_a_frame_past_the_end_names_the_index_and_the_frames_found(clips):
    with pytest.raises(VideoDecodeError, match=r"^frame 47 asked for, but the video has 47 frames$"):
        decode_frames(clips["mp4"].read_bytes(), [3, 47])
    # a header that lies: the MP4's index (written first) says 90 frames, the bytes hold fewer (the pack job
    # drops such a file; one packed before it checked reaches the loader)
    cut = clips["gop"].read_bytes()[: int(clips["gop"].stat().st_size * 0.6)]
    with pytest.raises(SampleError, match=r"the header gives 90 frames but the file holds the data of \d+ \("):
        read_header(cut)
    with pytest.raises(VideoDecodeError, match=r"^frame 80 asked for, but the video has (\d+) frames; decoding "
                       r"failed after them \(InvalidDataError: .*\)$") as e:
        decode_frames(cut, [0, 80])
    assert 0 < int(e.value.args[0].split(";")[0].split()[-2]) < 80
    assert decode_frames(cut, [0, 10]).shape == (2, 48, 64, 3)  # the frames before the cut stand
    cut = clips["webm"].read_bytes()[: int(clips["webm"].stat().st_size * 0.6)]  # a truncated WebM
    with pytest.raises(VideoDecodeError, match=r"^frame 30 asked for, but the video has \d+ frames$"):
        decode_frames(cut, [30])


def test_bytes_that_do_not_decode_are_one_line_naming_pyavs_error(clips):
    for data in (b"not a video at all" * 10, b"", clips["mp4"].read_bytes()[:300]):
        with pytest.raises(VideoDecodeError, match=r"^cannot decode the video \(\w+Error: ") as e:
            decode_frames(data, [0])
        assert "\n" not in str(e.value) and "<none>" not in str(e.value)
    err = pickle.loads(pickle.dumps(VideoDecodeError("frame 3 asked for")))  # as DataLoader re-raises it
    assert isinstance(err, FormatError) and str(err) == "frame 3 asked for"


def test_a_container_without_video_is_refused(tmp_path):
    path = tmp_path / "audio.webm"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libopus", rate=48000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.float32), format="flt", layout="mono")
        frame.sample_rate = 48000
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    with pytest.raises(VideoDecodeError, match=r"^the container holds no video stream$"):
        decode_frames(path.read_bytes(), [0])


def test_rows_keep_the_processors_layout_and_uint8_rows_normalise_to_them():
    frames = torch.randint(0, 256, (3, 3, 56, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    options = dict(temporal_patch_size=2, patch_size=14, merge_size=2, mean=CLIP_MEAN, std=CLIP_STD,
                   rescale_factor=1 / 255)
    rows = qwen_video_patches(frames, **options)
    raw = qwen_video_patches(frames, **options, normalize=False)
    assert rows.shape == raw.shape == (2 * 4 * 2, 3 * 2 * 14 * 14) and raw.dtype == torch.uint8
    assert rows.dtype == torch.float32
    # row 0: frame 0 and 1's top-left 14x14 patch, channel-major; the odd third frame is repeated
    assert torch.equal(raw[0].view(3, 2, 14, 14), frames[:2, :, :14, :14].permute(1, 0, 2, 3))
    assert torch.equal(raw[8].view(3, 2, 14, 14)[:, 1], frames[2, :, :14, :14])
    assert torch.equal(normalize_video_rows(raw, mean=CLIP_MEAN, std=CLIP_STD, rescale_factor=1 / 255), rows)
    assert torch.equal(resize_frames(frames.permute(0, 2, 3, 1).numpy(), 56, 28), frames)  # the size fits: as is


# ---- against the real video processors (one process for the module) ------------------------------------------

QWEN2_SETTINGS = {  # the processor's keywords -> the same as wdspack's sampling
    "defaults": ({}, QwenVideoSampling()),
    "fps and pixels": ({"do_sample_frames": True, "fps": 3.0, "min_pixels": 40 * 28 * 28, "max_pixels": 90 * 28 * 28},
                       QwenVideoSampling(do_sample_frames=True, fps=3.0, min_pixels=40 * 28 * 28,
                                         max_pixels=90 * 28 * 28)),
}
PROCESSORS = {  # processor class -> tiny_vlm module, video settings, wdspack's sampling, mean/std, patch size
    "Qwen2_5_VLProcessor": ("qwen2_5_vl", {"do_sample_frames": True, "fps": 2.0, "min_pixels": 16 * 28 * 28,
                                           "max_pixels": 48 * 28 * 28},
                            QwenVideoSampling(do_sample_frames=True, fps=2.0, min_pixels=16 * 28 * 28,
                                              max_pixels=48 * 28 * 28), CLIP_MEAN, CLIP_STD, 14),
    "Qwen3VLProcessor": ("qwen3_vl", {}, QWEN3_VL_VIDEO, HALF, HALF, 16),
}


@pytest.fixture(scope="module")
def processors(tmp_path_factory, clips) -> dict[str, tuple]:
    """Each tiny processor (no video processor: ``assemble_processor`` leaves it out), saved, and one call:
    a rendered chat with a video and an image."""
    import importlib

    from PIL import Image

    from wdspack.models import save_processor

    folder = tmp_path_factory.mktemp("processors")
    image = folder / "image.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(image)
    out = {}
    for cls, (module, *_) in PROCESSORS.items():
        processor = importlib.import_module(f"tiny_vlm.{module}").processor(folder / "tok")
        saved = save_processor(processor, folder / cls)
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "image"},
                                                 {"type": "text", "text": "What happens?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Bars move."}]}]
        text = processor.apply_chat_template(messages, tokenize=False)
        out[cls] = (processor, saved, {"text": text, "videos": [clips["gop"]], "images": [image]})
    return out


@pytest.fixture(scope="module")
def references(clips, processors) -> list:
    """All the module's references from one process: Qwen2-VL's video processor with each of
    :data:`QWEN2_SETTINGS`, Qwen3-VL's with its defaults, and the two whole processors."""
    jobs = [video_processor_job("qwen2_vl", [clips["mp4"], clips["webm"]] if name == "defaults" else clips.values(),
                                settings) for name, (settings, _) in QWEN2_SETTINGS.items()]
    jobs.append(video_processor_job("qwen3_vl", clips.values(), {}))
    jobs += [processor_job(saved, cls, PROCESSORS[cls][1], [call]) for cls, (_, saved, call) in processors.items()]
    return run_jobs(jobs)


def _pixels(path: Path, plan, *, patch_size: int, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """wdspack's rows for one clip: decode the planned frames, resize, patchify (float32; and uint8 normalised)."""
    frames = resize_frames(decode_frames(path.read_bytes(), plan.indices), plan.height, plan.width)
    assert frames.dtype == torch.uint8 and tuple(frames.shape) == (len(plan.indices), 3, plan.height, plan.width)
    options = dict(temporal_patch_size=2, patch_size=patch_size, merge_size=2, mean=mean, std=std,
                   rescale_factor=1 / 255)
    raw = qwen_video_patches(frames, **options, normalize=False)
    assert raw.dtype == torch.uint8
    return (qwen_video_patches(frames, **options),
            normalize_video_rows(raw, mean=mean, std=std, rescale_factor=1 / 255))


def _check_video(path: Path, plan, ref: dict, *, patch_size: int, mean, std) -> None:
    assert list(plan.indices) == ref["frames_indices"].tolist(), path.name
    assert [list(plan.grid)] == ref["video_grid_thw"].tolist(), path.name
    rows, from_uint8 = _pixels(path, plan, patch_size=patch_size, mean=mean, std=std)
    expected = torch.from_numpy(ref["pixel_values_videos"])
    assert torch.equal(rows, expected), f"{path.name}: {(rows - expected).abs().max()}"
    assert torch.equal(from_uint8, expected), path.name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(QWEN2_SETTINGS))
def test_pixels_equal_qwen2_vl_video_processor(clips, references, name):
    _, sampling = QWEN2_SETTINGS[name]
    refs = references[list(QWEN2_SETTINGS).index(name)]
    paths = [clips["mp4"], clips["webm"]] if name == "defaults" else list(clips.values())
    for path, ref in zip(paths, refs, strict=True):
        plan = plan_qwen2_vl(read_header(path.read_bytes()), sampling)
        assert (ref["width"], ref["height"]) == (read_header(path).width, read_header(path).height)
        _check_video(path, plan, ref, patch_size=14, mean=CLIP_MEAN, std=CLIP_STD)
    if name == "defaults":  # every frame, at least 128 tokens a frame pair: hundreds of rows
        assert len(refs[0]["frames_indices"]) == 47 and refs[0]["pixel_values_videos"].shape[0] >= 24 * 512


@pytest.mark.slow
def test_pixels_equal_qwen3_vl_video_processor(clips, references):
    odd = 0
    for path, ref in zip(clips.values(), references[len(QWEN2_SETTINGS)], strict=True):
        plan = plan_qwen3_vl(read_header(path.read_bytes()))
        odd += len(plan.indices) % 2
        _check_video(path, plan, ref, patch_size=16, mean=HALF, std=HALF)
    assert odd  # a clip whose odd frame count the processor pads


@pytest.mark.slow
@pytest.mark.parametrize("cls", list(PROCESSORS))
def test_whole_processor_reference_with_a_video_and_an_image(clips, processors, references, cls):
    _, _, sampling, mean, std, patch_size = PROCESSORS[cls]
    processor = processors[cls][0]
    (out,) = references[len(QWEN2_SETTINGS) + 1 + list(PROCESSORS).index(cls)]
    path = clips["gop"]
    header = read_header(path.read_bytes())
    plan = (plan_qwen3_vl if cls.startswith("Qwen3") else plan_qwen2_vl)(header, sampling)
    assert out["video_grid_thw"].tolist() == [list(plan.grid)]
    rows, _ = _pixels(path, plan, patch_size=patch_size, mean=mean, std=std)
    assert torch.equal(torch.from_numpy(out["pixel_values_videos"]), rows)
    ids = out["input_ids"][0]
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((ids == video_id).sum()) == plan.tokens
    assert int((ids == image_id).sum()) == int(np.prod(out["image_grid_thw"][0])) // 4
    assert out["pixel_values"].shape[0] == int(np.prod(out["image_grid_thw"][0]))
    assert out["input_ids"].shape == out["attention_mask"].shape
    if cls.startswith("Qwen3"):  # the timestamps in the text, per temporal patch
        assert qwen3_vl_prompt(plan) in processor.tokenizer.decode(ids)
    else:
        # 90 frames at 25 fps sampled at 2 a second: 6 frames, 2 a temporal patch spanning 1.2 s
        assert out["second_per_grid_ts"].tolist() == [plan.second_per_grid_t] == [pytest.approx(1.2)]
