"""The newline a source writes right after ``<image>`` / ``<video>`` (``<image>\\nWhat is it?``, LLaVA's way): one
rule for every family and both kinds (docs/guides/pack.md#the-newline-after-a-placeholder). Where the chat
template renders typed media parts it places the media itself and the newline is left to it (a sample reads the
same with or without the source's newline, never doubled); where the placeholder stays inline text, the newline
is kept as written."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from tests.support import vlm_harness as h
from wdspack.errors import Dropped
from wdspack.media.video.plan import VideoSettings
from wdspack.models import save_processor
from wdspack.packer.samples import SampleBuilder, SampleConfig
from wdspack.packer.sources import iter_records, list_partitions

av = pytest.importorskip("av")

#: family -> (tiny_vlm module, processor options, video settings where the family has a video path)
FAMILIES = {name: (spec[0], spec[1]) for name, spec in h.ALL_FAMILIES.items() if name != "mistral3_sliding"}
VIDEO = {"qwen2_5_vl": VideoSettings(fps=4.0), "qwen2_vl": VideoSettings(fps=4.0), "qwen3_vl": VideoSettings(fps=4.0),
         "llava_onevision": VideoSettings(num_frames=2)}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from tests.support.video_chats import clip

    root = tmp_path_factory.mktemp("media")
    (root / "p.png").write_bytes(h._png((60, 44), seed=1))
    clip(root / "a.mp4", codec="h264", rate=Fraction(10), frames=8, width=56, height=42)
    return root


def _texts(builder: SampleBuilder, root, kind: str, name: str) -> tuple[str, str]:
    """The sample's text with and without a newline after the placeholder."""
    out = []
    for k, ask in enumerate((f"<{kind}>\nWhat is it?", f"<{kind}>What is it?")):
        path = root / f"{name}-{kind}-{k}.jsonl"
        path.write_text(json.dumps({"id": f"r{k}", "messages": [{"role": "user", "content": ask},
                                                                {"role": "assistant", "content": "A thing."}],
                                    f"{kind}s": ["p.png" if kind == "image" else "a.mp4"]}) + "\n")
        (record,) = iter_records(list_partitions([str(path)])[0])
        assert not isinstance(record, Dropped), record
        out.append(builder.tokenizer.decode(builder.build(record).input_ids))
    return out[0], out[1]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_newline_after_a_placeholder_follows_one_rule(name, media, tmp_path, tiny_processors):
    processor = tiny_processors.family(name)  # the session's, built once
    folder = save_processor(processor, tmp_path / "processor")
    builder = SampleBuilder(SampleConfig(processor=str(folder), video=VIDEO.get(name)))
    kinds = ["image", "video"] if name in VIDEO else ["image"]
    for kind in kinds:
        typed = builder.typed[kind]
        with_newline, without = _texts(builder, media, kind, name)
        if typed:  # the template places the media: the source's newline is left to it, never doubled
            assert with_newline == without, (name, kind)
        else:  # inline text: the newline stays where the source wrote it, once
            assert with_newline != without and with_newline.replace("\nWhat is it?", "What is it?") == without, \
                (name, kind)
