"""Processor mode end to end, family-independent parts: the CLI, offline loading, the loader's options.

Uses the real Qwen2.5-VL processor class (``examples/tiny_vlm``) built offline.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from wdspack.cli import main
from wdspack.errors import ConfigError
from wdspack.models import load_processor, save_processor


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("qwen-mode")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96)
    return processor, folder, dataset


def test_cli_packs_with_the_processor(qwen, tmp_path, capsys):
    _, folder, dataset = qwen
    out = tmp_path / "cli"
    argv = ["pack", str(folder / "src" / "chats.jsonl"), "--output", str(out), "--processor",
            str(folder / "processor"), "--seq-len", "96", "--max-images", "4", "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["image_policy"] == {"kind": "processor", "name": str(folder / "processor"),
                                        "family": "qwen2_5_vl", "processor_class": "Qwen2_5_VLProcessor",
                                        "image": {"settings_from": "preprocessor_config.json",  # save_processor's
                                                  "size": {"longest_edge": 50176, "shortest_edge": 3136}}}
    assert manifest["tokenizer"]["image_token"] == "<|image_pad|>"
    # The same packs as the Python API's (same inputs, same seed: byte-identical shards).
    for shard in dataset.glob("*.tar"):
        assert (out / shard.name).read_bytes() == shard.read_bytes()


@pytest.mark.parametrize("extra, says", [
    (["--tokenizer", "x"], "--processor supplies the tokenizer"),
    (["--tokens-per-image", "64"], "drop"),
])
def test_cli_refuses_a_processor_with_fixed_mode_flags(qwen, tmp_path, capsys, extra, says):
    _, folder, _ = qwen
    argv = ["pack", str(folder / "src" / "chats.jsonl"), "--output", str(tmp_path / "o"), "--processor",
            str(folder / "processor"), "--seq-len", "96", "--quiet", *extra]
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_cli_needs_a_tokenizer_or_a_processor(tmp_path, capsys):
    assert main(["pack", "x.jsonl", "--output", str(tmp_path / "o"), "--seq-len", "96"]) == 2
    assert "--tokenizer" in capsys.readouterr().err


def test_processor_folder_loads_with_or_without_torchvision(qwen, caplog):
    """Without torchvision (this CPU torch) AutoProcessor cannot build the video processor, and the image side
    loads alone, saying so; with it (a CUDA machine's torch) the whole processor loads."""
    processor, folder, _ = qwen
    with caplog.at_level(logging.INFO, logger="wdspack.models"):
        loaded = load_processor(folder / "processor")
    assert type(loaded).__name__ == "Qwen2_5_VLProcessor"
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or present but not loadable with this torch
        assert "without its video processor" in caplog.text
    else:
        assert "without its video processor" not in caplog.text and loaded.video_processor is not None
    assert loaded.chat_template == processor.chat_template
    assert loaded.image_processor.merge_size == processor.image_processor.merge_size
    assert loaded.tokenizer.convert_tokens_to_ids("<|image_pad|>") == processor.image_token_id


def test_a_missing_processor_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"--processor '.*nowhere': no such folder"):
        load_processor(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()  # a folder, but no processor in it: transformers' answer, named
    with pytest.raises(ConfigError, match=r"cannot load processor .*empty"):
        load_processor(tmp_path / "empty")
    with pytest.raises(ConfigError, match="not a multimodal processor"):
        load_processor(object())


def test_loader_refuses_another_familys_processor(qwen, tmp_path):
    from tiny_vlm import qwen2_5_vl

    _, folder, dataset = qwen
    other = qwen2_5_vl.processor(folder / "tok", cls="Qwen2VLProcessor")
    with pytest.raises(ConfigError, match="packed with a qwen2_5_vl processor"):
        wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=other)
    with pytest.raises(ConfigError, match="not both"):
        wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=other,
                            image_transform=wdspack.make_image_transform())


@pytest.mark.parametrize("workers", [0, 1])
def test_uint8_patches_normalise_to_the_float32_patches(qwen, workers):
    """Flattened patches shipped as the processor's resized bytes, normalised after: the float32 batch, every
    other key identical; a family whose pixels cannot travel so refuses, naming the fix."""
    from dataclasses import replace

    processor, _, dataset = qwen
    loaders = {dtype: wdspack.make_loader(str(dataset), batch_size=2, num_workers=workers, processor=processor,
                                          seed=5, pixel_dtype=dtype, pin_memory=False)
               for dtype in ("float32", "uint8")}
    n = 0
    for _ in range(2):  # two epochs: recycled buffers in the worker
        for a, b in zip(loaders["uint8"], loaders["float32"], strict=True):
            assert list(a) == list(b) and a["pixel_values"].dtype == torch.uint8
            assert not a["pixel_values"][~a["patch_mask"]].any()
            with pytest.raises(ConfigError, match=r"pixel_values are uint8 .*wdspack.normalize_pixels"):
                wdspack.model_inputs(a, object())
            got = wdspack.normalize_pixels(a, loaders["uint8"], dtype=torch.float32)
            torch.testing.assert_close(got["pixel_values"], b["pixel_values"], rtol=0, atol=1e-6)
            assert not got["pixel_values"][~a["patch_mask"]].any()
            for key in b:
                if key != "pixel_values":
                    assert torch.equal(a[key], b[key]) if isinstance(b[key], torch.Tensor) else a[key] == b[key], key
            n += int(a["patch_mask"].sum())
    assert n > 0
    ds = wdspack.PackedDataset(str(dataset), processor=processor, batch_size=1)
    family = ds.model_batcher.family
    ds.model_batcher.family = replace(family, image=replace(family.image, uint8_pixels=False))
    with pytest.raises(ConfigError, match=r"pixel_dtype='uint8' is not available with Qwen2_5_VLProcessor .*"
                                          r"pass pixel_dtype='float32'"):
        wdspack.make_loader(ds, batch_size=1, num_workers=0, pixel_dtype="uint8")


def test_model_inputs_pick_the_real_rows_by_index_where_the_pixels_are_elsewhere(monkeypatch):
    """``take_rows``: rows on another device than their CPU mask (a batch normalised on the GPU; here "meta")
    go through ``index_select`` with indices found on the CPU, not a copy of the mask; on one device, the mask."""
    from wdspack.models.family import take_rows

    values, mask = torch.arange(24.0).reshape(6, 4), torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.bool)
    picked = []
    real = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select",
                        lambda self, dim, index: picked.append((self.device.type, index.device.type, index.shape))
                        or real(self, dim, index))
    elsewhere = take_rows(values.to("meta"), mask)
    assert elsewhere.device.type == "meta" and elsewhere.shape == (3, 4)
    assert picked == [("meta", "meta", (3,))]
    assert torch.equal(take_rows(values, mask), values[mask]) and len(picked) == 1, "one device: the mask itself"


@pytest.mark.gpu
def test_model_inputs_of_a_batch_normalised_on_the_gpu_do_not_wait_for_it(qwen):
    """uint8 rows normalised on the GPU, then ``model_inputs``: no host-device sync (the GPU's sync debug mode
    set to raise), and the same kwargs as the float32 batch on the CPU."""
    import copy

    from tiny_vlm import qwen2_5_vl

    processor, _, dataset = qwen
    model = qwen2_5_vl.model(processor)
    gpu_model = copy.deepcopy(model).to("cuda")
    loader = wdspack.make_loader(str(dataset), batch_size=2, num_workers=0, processor=processor, shuffle=False,
                                 pixel_dtype="uint8")
    floats = wdspack.make_loader(str(dataset), batch_size=2, num_workers=0, processor=processor, shuffle=False)
    for batch, want_batch in zip(loader, floats, strict=True):
        on_gpu = wdspack.normalize_pixels(batch, loader, device="cuda", non_blocking=True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = wdspack.model_inputs(on_gpu, gpu_model)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = wdspack.model_inputs(want_batch, model)
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].device.type == "cuda", key
                torch.testing.assert_close(got[key].cpu(), value, rtol=0, atol=1e-6, msg=key)
            else:
                assert got[key] == value, key


def test_workers_give_the_same_batches_as_in_process(qwen):
    processor, _, dataset = qwen
    streams = []
    for workers in (0, 1):  # one slot either way: the same packs in the same order
        loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=workers, processor=processor, seed=3)
        # Four epochs: the worker's shared pixel buffers are reused (stale rows zeroed) many times over.
        streams.append([{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                        for _ in range(4) for b in loader])
    assert len(streams[0]) == len(streams[1]) > 0
    for a, b in zip(*streams):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


def test_padding_free_keeps_the_four_position_rows(qwen):
    processor, _, dataset = qwen
    (plain,) = h.loader_batches(dataset, processor)
    (free,) = h.loader_batches(dataset, processor, padding_free=True)
    n = int(plain["num_tokens"].sum())
    assert free["position_ids"].shape == (4, 1, plain["input_ids"].numel())
    keep = (torch.arange(plain["input_ids"].shape[1])[None] < plain["num_tokens"][:, None])
    for row in range(4):
        assert torch.equal(free["position_ids"][row, 0, :n], plain["position_ids"][row][keep])
    assert torch.equal(free["mm_token_type_ids"][0, :n], plain["mm_token_type_ids"][keep])


def test_save_processor_round_trips_the_options(qwen, tmp_path):
    processor, _, _ = qwen
    saved = save_processor(processor, tmp_path / "p")
    config = json.loads((saved / "processor_config.json").read_text())
    assert config["processor_class"] == "Qwen2_5_VLProcessor"
    assert (saved / "chat_template.jinja").read_text() == processor.chat_template


def test_captions_and_documents_pack_for_the_processor_and_feed_its_model(qwen, tmp_path):
    """Pre-training records in processor mode: each image laid out as the processor lays it out
    (the real model checks that its image features and image tokens agree), caption and document
    text trained, image tokens never."""
    from tests.support.pretrain import caption_shard, write_documents
    from tiny_vlm import qwen2_5_vl
    from wdspack.format.dataset import iter_dataset_packs, open_dataset
    from wdspack.packer.samples import SampleConfig
    from wdspack.packer.text import PretrainConfig

    processor, folder, _ = qwen
    shard = caption_shard(tmp_path / "caps.tar", 4)
    docs = write_documents(tmp_path)
    pretrain = PretrainConfig(eos_token="<|endoftext|>", caption_template="{image}A photo of {caption}")
    config = SampleConfig(processor=str(folder / "processor"), pretrain=pretrain)
    out = tmp_path / "out"
    wdspack.pack_dataset([str(shard), str(docs["parquet"])], out, sample_config=config,
                         config=wdspack.PackConfig(seq_len=512, max_images=8,
                                                   run=wdspack.RunOptions(max_drop_fraction=1)))
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    manifest, root = open_dataset(str(out))
    kinds = set()
    for _, pack in iter_dataset_packs(manifest, root):
        ids, mask = pack.input_ids, pack.loss_mask
        assert int((ids == pad).sum()) == sum(pack.image_tokens) and not mask[ids == pad].any()
        assert mask.any()  # captions and document text are targets
        kinds.update(sid.split(":")[0] for sid in pack.sample_ids)
    assert {"caps.tar", "doc-a", "doc-c"} <= kinds
    model = qwen2_5_vl.model(processor, seed=0)
    batches = list(wdspack.make_loader(out, batch_size=1, num_workers=0, processor=processor, shuffle=False))
    assert batches and all(b["image_grid_thw"].shape[0] > 0 for b in batches)
    for batch in batches:
        loss = model(**wdspack.model_inputs(batch, model)).loss  # raises if features and tokens disagree
        assert torch.isfinite(loss)
