"""Shared fixtures: real tokenizers loaded offline.

- ``tekken_dir``: a folder holding the Pixtral tokenizer (``tekken.json`` from mistral_common).
- ``pixtral_template``: the text of ``examples/chat_templates/pixtral.jinja``.
- ``sample_config``: both as a :class:`~wdspack.samples.SampleConfig`, 16 ``[IMG]`` tokens per image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tekken_dir(tmp_path_factory) -> Path:
    import mistral_common

    folder = tmp_path_factory.mktemp("tekken")
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return folder


@pytest.fixture(scope="session")
def pixtral_template() -> str:
    return (ROOT / "examples" / "chat_templates" / "pixtral.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def sample_config(tekken_dir, pixtral_template):
    from wdspack.samples import SampleConfig

    return SampleConfig(tokenizer=str(tekken_dir), chat_template=pixtral_template, tokens_per_image=16,
                        image_token="[IMG]")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device: skipped (with the reason) where there is none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (FlashAttention-2 / GPU kernels); none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
