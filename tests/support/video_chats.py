"""Video chats for the video family tests: the records (LLaMA-Factory's and LLaVA-Video's layouts), small
clips made with PyAV, the turns as typed parts for the reference processor, and the one-by-one loss and
gradients on the real processor's outputs (``tests/models/test_video_*.py``)."""

from __future__ import annotations

import tempfile
from fractions import Fraction
from functools import cache
from pathlib import Path

import numpy as np
import torch

from tests.support import vlm_harness as h

__all__ = ["ROWS", "clip", "one_by_one", "source_folder", "typed"]

#: id -> (record as written, in LLaMA-Factory's or LLaVA-Video's layout; its turns as typed parts for the reference)
ROWS = {
    "v-one": {"messages": [{"role": "user", "content": "<video>What happens in the video?"},
                           {"role": "assistant", "content": "The colours change and a bar grows."}],
              "videos": ["clips/a.mp4"]},
    "v-odd": {"messages": [{"role": "user", "content": "<video>Describe it."},
                           {"role": "assistant", "content": "A short clip."},
                           {"role": "user", "content": "Anything else?"},
                           {"role": "assistant", "content": "No."}],
              "videos": ["clips/b.mp4"]},
    "v-mixed": {"messages": [{"role": "user", "content": "Compare <image> with <video> please."},
                             {"role": "assistant", "content": "The picture is still; the clip moves."}],
                "images": ["images/p.png"], "videos": ["clips/c.webm"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
    "v-llava": {"video": "clips/c.webm",  # LLaVA-Video-178K: <image> stands for the record's video
                "conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                                  {"from": "gpt", "value": "Moving colours."}]},
}


def clip(path: Path, *, codec: str, rate: Fraction, frames: int, width: int, height: int) -> Path:
    """``path`` written with a clip of ``frames`` seeded frames (a white bar growing over noise); each clip is
    encoded once per process (the video test modules of a session share them) and copied where it is asked for."""
    path.write_bytes(_encoded(path.suffix, codec, rate, frames, width, height))
    return path


@cache
def _encoded(suffix: str, codec: str, rate: Fraction, frames: int, width: int, height: int) -> bytes:
    import av

    with tempfile.TemporaryDirectory(prefix="clip-") as folder:
        path = Path(folder) / f"clip{suffix}"
        with av.open(str(path), "w") as out:
            stream = out.add_stream(codec, rate=rate)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            rng = np.random.default_rng(frames)
            for k in range(frames):
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                pixels[:, : (k * 3) % width] = 255
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        return path.read_bytes()


def source_folder(root: Path) -> Path:
    """``root/src`` with the clips and the picture :data:`ROWS` name (``clips/a.mp4``, ``b.mp4`` at 29.97 fps,
    ``c.webm`` with no frame count in its header, ``images/p.png``)."""
    src = root / "src"
    (src / "clips").mkdir(parents=True)
    (src / "images").mkdir()
    clip(src / "clips" / "a.mp4", codec="h264", rate=Fraction(10), frames=12, width=66, height=50)
    clip(src / "clips" / "b.mp4", codec="h264", rate=Fraction(30000, 1001), frames=9, width=40, height=30)
    clip(src / "clips" / "c.webm", codec="libvpx-vp9", rate=Fraction(24), frames=8, width=64, height=36)
    (src / "images" / "p.png").write_bytes(h._png((60, 44), seed=3))
    return src


def typed(row: dict) -> list[dict]:
    """The record's turns as typed parts (what the reference renders with the chat template)."""
    turns = row.get("messages") or [{"role": {"human": "user", "gpt": "assistant"}[t["from"]], "content": t["value"]}
                                    for t in row["conversations"]]
    video_for_image = "video" in row and "images" not in row
    out = []
    for turn in turns:
        parts: list[dict] = []
        for piece in turn["content"].replace("<video>", "\0video\0").replace("<image>", "\0image\0").split("\0"):
            if piece in ("video", "image"):
                parts.append({"type": "video" if video_for_image else piece})
            elif piece:
                after_media = parts and parts[-1]["type"] in ("video", "image")
                parts.append({"type": "text", "text": piece[1:] if after_media and piece.startswith("\n") else piece})
        out.append({"role": turn["role"], "content": [p for p in parts if p.get("text", True)]})
    return out


def one_by_one(model, dataset, refs):
    """Loss sum, target count and gradients of the sub-samples one by one, on the real processor's inputs."""
    subs = h.dataset_sub_samples(dataset)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for sid, ref in refs.items():
        inputs = {k: torch.from_numpy(v) for k, v in ref.items() if k != "attention_mask"}
        ids, mask = subs[sid][:2]
        labels = torch.where(torch.from_numpy(mask.astype(bool)), torch.from_numpy(ids), -100)[None]
        labels[0, 0] = -100
        loss = h._token_losses(model(**inputs, use_cache=False).logits, labels)
        loss.backward()
        total, count = total + loss.detach(), count + int((labels[:, 1:] != -100).sum())
    return total, count, h._gradients(model)
