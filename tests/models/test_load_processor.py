"""``load_processor`` without torchvision loads the tokenizer once (#20).

``AutoProcessor`` loads the tokenizer before the video processor that fails without torchvision;
``load_processor`` asks the video processor first and goes to the image side at once. The count is
taken at transformers' ``PreTrainedTokenizerBase.from_pretrained``, which every tokenizer load runs.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

from wdspack.errors import ConfigError
from wdspack.models import load_processor, save_processor

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                                reason="torchvision is installed: AutoProcessor loads the video side itself")


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("qwen-load")
    return save_processor(qwen2_5_vl.processor(folder / "tok"), folder / "processor")


def _count_tokenizer_loads(monkeypatch) -> list[str]:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    loads: list[str] = []
    real = PreTrainedTokenizerBase.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(cls.__name__)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "from_pretrained", classmethod(counting))
    return loads


def test_the_tokenizer_loads_once_when_the_video_side_cannot(qwen_folder, monkeypatch, caplog):
    loads = _count_tokenizer_loads(monkeypatch)
    with caplog.at_level(logging.INFO, logger="wdspack.models"):
        proc = load_processor(qwen_folder)
    assert type(proc).__name__ == "Qwen2_5_VLProcessor" and proc.tokenizer.convert_tokens_to_ids("<|image_pad|>") > 0
    assert len(loads) == 1, f"the tokenizer loaded {len(loads)} times: {loads}"
    assert "without its video processor (its video processor cannot load: ImportError" in caplog.text


def test_a_broken_image_side_names_both_reasons(qwen_folder, tmp_path):
    """The video side's reason and the image side's, in one message with the fix."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for part in qwen_folder.iterdir():
        if part.name != "preprocessor_config.json":  # no image processor config: the image side cannot load
            (broken / part.name).write_bytes(part.read_bytes())
    with pytest.raises(ConfigError) as e:
        load_processor(broken)
    msg = str(e.value)
    assert "its video processor cannot load" in msg and "loading its image side alone said" in msg
    assert "Give a local processor folder" in msg
