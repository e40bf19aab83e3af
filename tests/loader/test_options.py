"""The option records (issue #20 item 3): each checks itself, takes its simple form, and the loader's
surface forwards nothing blindly.

- ``ReadOptions`` / ``Balance``: frozen, checked in ``__post_init__``, built from a dict or a word.
- ``make_loader``: explicit arguments only (a misspelt option is a ``TypeError`` naming it, not a
  silent no-op), and a dataset built already takes no dataset options.
- ``SampleConfig``: a library caller gets the CLI's errors when the record is built, before any
  tokenizer loads; ``PackConfig`` keeps where tasks run (``RunOptions``) apart from the bytes.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import wdspack
from wdspack import Balance, ConfigError, PackConfig, PackedDataset, ReadOptions, RunOptions, SampleConfig
from wdspack.packer.text import PretrainConfig


@pytest.mark.parametrize("kw, match", [
    (dict(block_size=100), r"block_size \(100\) must be >= 512"),
    (dict(retries=-1), r"retries \(-1\) >= 0"),
    (dict(backoff=float("inf")), "backoff=inf must be a finite number"),
    (dict(timeout=0), "timeout=0 must be > 0 seconds"),
    (dict(storage_options=["token"]), "storage_options must be a mapping"),
])
def test_read_options_check_themselves(kw, match):
    with pytest.raises(ConfigError, match=match):
        ReadOptions(**kw)


def test_read_options_simple_forms_and_secrets():
    assert ReadOptions.of(None) == ReadOptions()
    assert ReadOptions.of({"timeout": 5, "retries": "3"}) == ReadOptions(timeout=5.0, retries=3)
    with pytest.raises(ConfigError, match=r"read= keys \['time_out'\] are unknown"):
        ReadOptions.of({"time_out": 5})
    with pytest.raises(ConfigError, match=r"pass a wdspack\.ReadOptions or a dict"):
        ReadOptions.of(5)
    secret = ReadOptions(storage_options={"token": "hf_secret_value"})
    assert "hf_secret_value" not in repr(secret) and "storage_options" not in repr(secret)
    with pytest.raises(dataclasses.FrozenInstanceError):
        secret.timeout = 1  # type: ignore[misc]
    assert ReadOptions(timeout=3).stream_kwargs() == {"block_size": 1 << 20, "retries": 5, "backoff": 0.5,
                                                      "timeout": 3.0}


def test_balance_simple_forms():
    assert Balance.of(None) is None
    assert Balance.of("cost") == Balance() == Balance.of({})
    assert Balance.of({"run": 1, "heaviest_first": 1}) == Balance(run=1, heaviest_first=True)
    assert Balance(cost_model={"images": 2.0}).cost_model == wdspack.CostModel(images=2.0)
    with pytest.raises(ConfigError, match=r"balance='costs' is not one of \(None, 'cost'\)"):
        Balance.of("costs")
    with pytest.raises(ConfigError, match="window=0 must be >= 1"):
        Balance(window=0)


def test_make_loader_takes_only_what_it_names():
    params = inspect.signature(wdspack.make_loader).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    dataset_params = set(inspect.signature(PackedDataset.__init__).parameters) - {"self", "source"}
    assert dataset_params <= set(params), "every dataset option is an explicit make_loader argument"
    assert len(params) <= 30


def test_make_loader_refuses_misspelt_and_doubled_options(demo_packed):
    folder, _ = demo_packed
    with pytest.raises(TypeError, match="read_timeout"):
        wdspack.make_loader(folder, batch_size=2, read_timeout=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="balance_run"):
        wdspack.make_loader(folder, batch_size=2, balance_run=4)  # type: ignore[call-arg]
    ds = PackedDataset(folder, batch_size=2, text_only=True)
    with pytest.raises(ConfigError, match=r"dataset options \['read', 'seed'\] were given with a dataset built"):
        wdspack.make_loader(ds, batch_size=2, seed=3, read={"timeout": 1})
    loader = wdspack.make_loader(ds, batch_size=2, num_workers=0)  # defaults left alone: accepted
    assert loader.dataset is ds
    timed = wdspack.make_loader(folder, batch_size=2, num_workers=0, text_only=True, read={"timeout": 7})
    assert timed.dataset.read.timeout == 7.0 and timed.dataset._read["timeout"] == 7.0


@pytest.mark.parametrize("kw, match", [
    (dict(), "give --tokenizer .* or --processor"),
    (dict(tokenizer="tok", tokens_per_image="many"), "--tokens-per-image 'many': give a number"),
    (dict(tokenizer="tok", tokens_per_image=-1), "--tokens-per-image must be >= 0"),
    (dict(processor="proc", tokenizer="tok"), "--processor supplies the tokenizer"),
    (dict(processor="proc", tokens_per_image=64), "--processor supplies the tokenizer"),
    (dict(tokenizer="tok", tokens_per_image=64, max_image_side=0), "--max-image-side must be >= 1"),
    (dict(tokenizer="tok", tokens_per_image=64, pretrain={"bos_token": "<s>"}), "pass a wdspack.packer.text"),
    (dict(tokenizer="tok", tokens_per_image=64, chat_template="{% for m in messages %}{{ m }}"),
     r"chat_template, line 1: .*; fix the template's Jinja syntax"),
])
def test_sample_config_checks_itself_before_any_tokenizer_loads(kw, match):
    """Names that do not exist as tokenizers ('tok', 'proc'): the record refuses before loading anything."""
    with pytest.raises(ConfigError, match=match):
        SampleConfig(**kw)


def test_sample_config_normalises_what_the_cli_gives():
    config = SampleConfig("tok", tokens_per_image="64", pretrain=PretrainConfig(bos_token="<s>"))
    assert config.tokens_per_image == 64
    assert SampleConfig("tok", tokens_per_image="processor:Qwen/Qwen2-VL").tokens_per_image == "processor:Qwen/Qwen2-VL"
    assert SampleConfig(processor="proc").tokens_per_image is None


def test_pack_config_keeps_where_tasks_run_apart():
    fields = {f.name for f in dataclasses.fields(PackConfig)}
    assert {"workers", "executor", "ray_address", "max_drop_fraction"}.isdisjoint(fields)
    assert {f.name for f in dataclasses.fields(RunOptions)} == {"workers", "executor", "ray_address",
                                                                 "max_drop_fraction"}
    with pytest.raises(TypeError, match="workers"):
        PackConfig(seq_len=64, workers=2)  # type: ignore[call-arg]
