"""``wdspack.loader.wds``: a stock webdataset pipeline with wdspack's stages yields ``make_loader``'s batches.

Every comparison is tensor for tensor (dtype and key order included) against
``make_loader(..., shuffle=False, num_workers=0)`` over the same packs in the same order:

* ``wds.DataPipeline(SimpleShardList, split_by_node, split_by_worker, tarfile_to_samples, to_examples, batched)``
  with images, with each batch option, and with ``mp`` decoded upstream;
* two simulated ranks (``RANK`` / ``WORLD_SIZE``): each rank's batches equal ``make_loader`` over
  the shards ``split_by_node`` gave it, and on uneven shards the ranks' step counts differ
  (what ``make_loader`` prevents: its ranks get ``len(loader)`` batches each);
* two DataLoader workers (``wds.WebLoader``);
* model-ready batches from the tiny Qwen2.5-VL processor;
* webdataset's own ``hf://`` opener (``gopen_hf``: HfFileSystem + curl) against olah on loopback;
* a ``.pickle`` member in a shard is never unpickled by the documented pipeline (while
  webdataset's default ``.decode()`` does unpickle it: the check can fail).
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

wds = pytest.importorskip("webdataset")

import wdspack
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError, FormatError
from wdspack.loader.wds import batched, collate, decode_packs, read_dataset, to_examples

ROOT = Path(__file__).resolve().parents[2]
B = 2


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b), (len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        assert list(x) == list(y), (i, list(x), list(y))
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), (i, k)
            else:
                assert x[k] == y[k], (i, k)


def _numbers(batches) -> list[list[int]]:
    return [pack_numbers(b["input_ids"]) for b in batches]


def _pipeline(urls, *stages) -> list[dict]:
    return list(wds.DataPipeline(wds.SimpleShardList(list(urls)), wds.split_by_node, wds.split_by_worker,
                                 wds.tarfile_to_samples(handler=wds.reraise_exception), *stages))


@pytest.fixture(scope="module")
def even(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("even")
    write_dataset(folder, shards=4, packs_per_shard=6, seed=3)
    return folder


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("uneven")
    write_dataset(folder, shards=4, packs_per_shard=[10, 2, 8, 4], seed=4)
    return folder


@pytest.fixture(scope="module")
def transform():
    return wdspack.make_image_transform(size=32)


@pytest.mark.parametrize("options", [{}, {"padding_free": True}, {"attention_mask": "4d"}, {"max_segments": None}])
def test_batches_equal_make_loader(even, transform, options):
    info = read_dataset(even)
    assert info.urls == tuple(str(even / f"train-{i:06d}.tar") for i in range(4)) and info.packs == (6,) * 4
    assert (info.seq_len, info.max_images, info.pad_token_id, info.max_samples_per_pack) == (64, 2, 0, 3)
    loader_options = {k: v for k, v in options.items() if k != "max_segments"}
    expected = list(wdspack.make_loader(even, batch_size=B, num_workers=0, shuffle=False, image_transform=transform,
                                        max_segments=options.get("max_segments", "auto"), **loader_options))
    got = _pipeline(info.urls, to_examples(info, image_transform=transform), batched(B, dataset=info, **options))
    if not options.get("padding_free"):  # padding-free rows are [1, B·L]: packs back to back
        assert _numbers(got) == [[2 * i, 2 * i + 1] for i in range(12)]
    assert len(got) == 12 and any(b["image_mask"].any() for b in got) and "pixel_values" in got[0]
    _same(got, expected)


def test_decoded_mp_and_wds_batched_give_the_same_batches(even, transform):
    info = read_dataset(even)
    expected = list(wdspack.make_loader(even, batch_size=B, num_workers=0, shuffle=False, image_transform=transform))
    # .decode(only="mp"): webdataset's msgpack decoder for the pack member and no other decoder at all
    ds = wds.WebDataset(list(info.urls), shardshuffle=False).decode(only=["mp"])
    assert isinstance(next(iter(ds))["mp"], dict)
    got = list(ds.compose(to_examples(info, image_transform=transform),
                          wds.batched(B, collation_fn=functools.partial(
                              collate, max_segments=B * (info.max_samples_per_pack + 1)), partial=False)))
    _same(got, expected)
    # decode_packs as a stage of its own, then to_examples on the packs
    got = _pipeline(info.urls, decode_packs(info), to_examples(info, image_transform=transform),
                    batched(B, dataset=info))
    _same(got, expected)


def test_two_ranks_split_by_node_equal_make_loader_per_rank_but_unequal_steps(uneven, transform, monkeypatch):
    info = read_dataset(uneven)
    steps = {}
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        got = _pipeline(info.urls, to_examples(info, image_transform=transform), batched(B, dataset=info))
        mine = list(info.urls[rank::2])  # what split_by_node gives this rank
        expected = list(wdspack.make_loader(mine, batch_size=B, num_workers=0, shuffle=False,
                                            image_transform=transform))
        _same(got, expected)
        steps[rank] = len(got)
        monkeypatch.delenv("RANK")
        monkeypatch.delenv("WORLD_SIZE")
    # shards of 10, 2, 8, 4 packs: split_by_node gives rank 0 18 packs and rank 1 6, so 9 steps vs 3:
    # rank 1 runs dry while rank 0 waits in its next all_reduce
    assert steps == {0: 9, 1: 3}
    lens = [len(wdspack.make_loader(uneven, batch_size=B, num_workers=0, rank=r, world_size=2)) for r in range(2)]
    assert lens == [6, 6]


def test_two_workers_through_webloader(uneven, transform):
    info = read_dataset(uneven)
    pipeline = wds.DataPipeline(wds.SimpleShardList(list(info.urls)), wds.split_by_node, wds.split_by_worker,
                                wds.tarfile_to_samples(), to_examples(info, image_transform=transform),
                                batched(B, dataset=info))
    got = list(wds.WebLoader(pipeline, batch_size=None, num_workers=2))
    expected = {}
    for worker in range(2):  # worker w reads shards w, w + 2, ... (split_by_worker), in order
        for batch in wdspack.make_loader(list(info.urls[worker::2]), batch_size=B, num_workers=0, shuffle=False,
                                         image_transform=transform):
            expected[tuple(pack_numbers(batch["input_ids"]))] = batch
    assert sorted(expected) == sorted(tuple(n) for n in _numbers(got))
    _same(got, [expected[tuple(n)] for n in _numbers(got)])


def test_budgets_are_checked_and_bad_samples_go_through_the_handler(even, transform, caplog):
    info = read_dataset(even)
    with pytest.raises(ConfigError, match="seq_len=128 does not match the dataset's seq_len 64"):
        to_examples(info, seq_len=128)
    with pytest.raises(ConfigError, match="pad_token_id is needed"):
        to_examples(seq_len=64, max_images=2)
    good = next(iter(wds.WebDataset(info.urls[0], shardshuffle=False)))
    bad = {"__key__": "x", "__url__": "s.tar", "mp": b"\x93not a pack"}
    stage = to_examples(info)
    with pytest.raises(FormatError, match=r"s.tar member 'x': pack is not valid msgpack"):
        list(stage([bad, good]))
    out = list(to_examples(info, handler=wds.warn_and_continue)([bad, good]))
    assert [pack_numbers(e["input_ids"]) for e in out] == [[0]]
    assert list(to_examples(info, handler=wds.ignore_and_stop)([bad, good])) == []


@pytest.fixture(scope="module")
def tampered(even, tmp_path_factory) -> tuple[Path, Path]:
    """``even`` with two pickles in shard 0: one beside pack 1 (same key), one on its own; each makes a folder."""
    folder = tmp_path_factory.mktemp("tampered")
    marker = folder / "UNPICKLED"
    payload = pickle.dumps(_Evil(str(marker)))
    for name in os.listdir(even):
        if name != "train-000000.tar":
            (folder / name).write_bytes((even / name).read_bytes())
    with tarfile.open(even / "train-000000.tar") as src, tarfile.open(folder / "train-000000.tar", "w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
            if member.name in ("000000000001.mp", "000000000003.mp"):
                key = member.name[:-3] if member.name.endswith("1.mp") else "zz-evil"
                info = tarfile.TarInfo(f"{key}.pickle")
                info.size = len(payload)
                dst.addfile(info, __import__("io").BytesIO(payload))
    return folder, marker


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_pickle_member_is_never_unpickled(tampered, even, transform):
    folder, marker = tampered
    info = read_dataset(folder)
    expected = list(wdspack.make_loader(even, batch_size=B, num_workers=0, shuffle=False, image_transform=transform))
    got = list(wds.DataPipeline(wds.SimpleShardList(list(info.urls)), wds.split_by_node, wds.split_by_worker,
                                wds.tarfile_to_samples(handler=wds.warn_and_continue),
                                to_examples(info, image_transform=transform, handler=wds.warn_and_continue),
                                batched(B, dataset=info)))
    _same(got, expected)  # the pack beside a pickle is kept, the pickle-only sample skipped
    with pytest.raises(FormatError, match=r"\['.pickle'\] beside the pack, not read"):
        _pipeline(info.urls, to_examples(info, image_transform=transform), batched(B, dataset=info))
    assert not marker.exists()
    # the control: webdataset's default decoders do unpickle it (the second pickle's mkdir then fails)
    for _ in wds.WebDataset(info.urls[0], shardshuffle=False).decode(handler=wds.ignore_and_continue):
        pass
    assert marker.is_dir()
    marker.rmdir()


def test_model_ready_batches_equal_make_loader(tmp_path):
    from tests.support.vlm_harness import pack_chats
    from tiny_vlm import qwen2_5_vl

    processor = qwen2_5_vl.processor(tmp_path / "tok")
    packed = pack_chats(tmp_path, processor, seq_len=96)
    info = read_dataset(packed)
    expected = list(wdspack.make_loader(packed, batch_size=B, num_workers=0, shuffle=False, processor=processor))
    got = _pipeline(info.urls, to_examples(info, processor=processor), batched(B, dataset=info))
    assert expected and "image_grid_thw" in got[0] and got[0]["position_ids"].shape[0] == 4
    _same(got, expected)
    model = qwen2_5_vl.model(processor)
    assert list(wdspack.model_inputs(got[0], model)) == list(wdspack.model_inputs(expected[0], model))
    with pytest.raises(ConfigError, match="processor= or image_transform=, not both"):
        to_examples(info, processor=processor, image_transform=wdspack.make_image_transform(size=32))


_HF_SCRIPT = """
import sys, torch, webdataset as wds
from wdspack.loader.wds import read_dataset, to_examples, batched
import wdspack
info = read_dataset("hf://datasets/org/packed@main")
print("\\n".join(info.urls), file=sys.stderr)
tf = wdspack.make_image_transform(size=32)
pipe = wds.DataPipeline(wds.SimpleShardList(list(info.urls)), wds.split_by_node, wds.split_by_worker,
                        wds.tarfile_to_samples(), to_examples(info, image_transform=tf), batched(2, dataset=info))
torch.save(list(pipe), sys.argv[1])
"""


def test_webdatasets_hf_opener_against_a_loopback_hub(even, transform, tmp_path_factory, tmp_path):
    from tests.support.hubserver import publish, start_hub

    mirrors = tmp_path_factory.mktemp("mirrors")
    endpoint, requests, stop = start_hub(mirrors, workdir=tmp_path_factory.mktemp("olah"))
    try:
        sha = publish(mirrors, "org/packed", even)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        # huggingface_hub reads the endpoint when imported: a fresh process pointed at the loopback
        # server, online towards it only (HF_HUB_OFFLINE=1 would refuse it too)
        env.update(HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", HF_TOKEN="hf_loopbacktoken", HF_HOME=str(tmp_path / "hf"),
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env.pop(proxy, None)
        out = tmp_path / "batches.pt"
        run = subprocess.run([sys.executable, "-c", _HF_SCRIPT, str(out)], env=env, cwd=ROOT, capture_output=True,
                             check=False, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        log = requests()
    finally:
        stop()
    urls = run.stderr.split()[:4]
    assert urls == [f"hf://datasets/org/packed@{sha}/train-{i:06d}.tar" for i in range(4)]
    got = torch.load(out, weights_only=True)
    expected = list(wdspack.make_loader(even, batch_size=B, num_workers=0, shuffle=False, image_transform=transform))
    _same(got, expected)
    # read_dataset: the loader's 3 requests (repo check, pin main to its commit, the manifest); then
    # gopen_hf: HfFileSystem resolves each shard's path (the revision check, cached per process: one
    # per worker process) and curl GETs the shard: one GET per shard, no Range
    asked = [(r["method"], r["path"], r["status"]) for r in log if "org/packed" in r["path"]]
    assert asked == [("GET", "/api/datasets/org/packed/revision/main", 200)] * 2 + [
        ("GET", f"/datasets/org/packed/resolve/{sha}/manifest.json", 200),
        ("GET", f"/api/datasets/org/packed/revision/{sha}", 200)] + [
        ("GET", f"/datasets/org/packed/resolve/{sha}/train-{i:06d}.tar", 200) for i in range(4)]


def test_the_example_runs_and_prints_the_batch_shapes(even, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("webdataset_pipeline", ROOT / "examples" / "webdataset_pipeline.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main([str(even), "--image-size", "32", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("batch ") == 2 and "input_ids            [2, 64] int64" in out
    assert "pixel_values         [4, 3, 32, 32] float32" in out and "cu_seqlens           [9] int32" in out
