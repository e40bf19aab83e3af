"""Pre-training sources: WebDataset caption shards, interleaved/plain-text documents, splitting.

Real parts: the Pixtral tekken tokenizer, real tar files, Parquet, save_to_disk, a local S3 server.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.demo import read_files
from tests.support.pretrain import caption_shard, image, write_documents, write_tar
from tests.support.resume import pack_interrupted_then_resumed
from wdspack.cli import main
from wdspack.errors import ConfigError, Dropped, SampleError
from wdspack.format.dataset import open_dataset
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig, get_builder
from wdspack.packer.sources import TextRecord, iter_records, list_partitions
from wdspack.packer.sources.documents import IMAGE, build_document, is_document
from wdspack.packer.sources.webdataset import split_member_name
from wdspack.packer.text import PretrainConfig, build_samples

TPI = 4  # tokens per image


class _Evil:
    """Unpickling this writes a file: proof that a member was unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _config(tokenizer, **pretrain) -> SampleConfig:
    """A folder for the pack jobs' processes; the loaded tokenizer (``tekken``) where builders run here."""
    return SampleConfig(str(tokenizer) if isinstance(tokenizer, Path) else tokenizer, tokens_per_image=TPI,
                        image_token="[IMG]", pretrain=PretrainConfig(eos_token="</s>", **pretrain))


def _read(sources, **kw) -> list:
    return [r for p in list_partitions([str(s) for s in sources], **kw) for r in iter_records(p)]


# ---- WebDataset shards --------------------------------------------------------------------------


def test_member_names_split_as_webdataset_splits_them():
    assert split_member_name("000123.jpg") == ("000123", "jpg")
    assert split_member_name("a/b/000123.seg.png") == ("a/b/000123", "seg.png")
    assert split_member_name("x.y/000123.txt") == ("x.y/000123", "txt")
    assert split_member_name("README") is None


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_member_headers_read_like_tarfile_reads_them(tmp_path, fmt):
    deep = "d" * 90 + "/" + "e" * 60 if fmt == tarfile.USTAR_FORMAT else "x" * 150 + "/ü"
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for k in range(3):
            for ext, data in (("jpg", image("red", "JPEG")), ("txt", f"caption {k}".encode())):
                info = tarfile.TarInfo(f"{deep}/{k:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        tar.addfile(_dir_info(f"{deep}/adir"[-90:]))  # a folder entry: not a member of any sample
    got = _read([path])
    assert [r.sample_id for r in got] == [f"s.tar:{deep}/{k:04d}" for k in range(3)]
    assert [r.segments[1] for r in got] == [f"caption {k}" for k in range(3)]


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def test_caption_members_by_rule_and_corrupt_ones_dropped_with_reasons(tmp_path):
    marker = tmp_path / "unpickled"
    shard = write_tar(tmp_path / "shard-000000.tar", [
        ("a.jpg", image("red", "JPEG")), ("a.txt", b"  A red square.\n"), ("a.cls", b"3"),
        ("a.pyd", pickle.dumps(_Evil(str(marker)))), ("a.pickle", pickle.dumps(_Evil(str(marker)))),
        ("b.png", image("green")), ("b.json", json.dumps({"caption": "Green.", "url": "http://x"}).encode()),
        ("c.webp", image("blue", "WEBP")), ("c.json", json.dumps({"text": "Blue."}).encode()),
        ("d.jpg", image("red", "JPEG")),                                          # no caption
        ("e.txt", b"no image"),                                                    # no image
        ("f.jpg", image("red", "JPEG")), ("f.png", image("red")), ("f.txt", b"two images"),
        ("g.jpg", image("red", "JPEG")), ("g.txt", b"\xff\xfe not utf-8"),
        ("h.jpg", image("red", "JPEG")), ("h.json", b"{not json"),
        ("i.jpg", image("red", "JPEG")), ("i.txt", b"   "),
    ])
    got = {r.sample_id: r for r in _read([shard])}
    assert list(got) == [f"shard-000000.tar:{k}" for k in "abcdefghi"]
    a = got["shard-000000.tar:a"]
    assert isinstance(a, TextRecord) and a.kind == "caption" and a.segments == (IMAGE, "A red square.")
    assert a.images == (image("red", "JPEG"),)
    assert got["shard-000000.tar:b"].segments == (IMAGE, "Green.")
    assert got["shard-000000.tar:c"].segments == (IMAGE, "Blue.")
    reasons = {k[-1]: (r.reason, r.detail) for k, r in got.items() if isinstance(r, Dropped)}
    assert reasons["d"][0] == "malformed_record" and "no caption" in reasons["d"][1]
    assert reasons["e"][0] == "missing_image" and "'txt'" in reasons["e"][1]
    assert reasons["f"][0] == "malformed_record" and "2 image members" in reasons["f"][1]
    assert reasons["g"][0] == "malformed_record" and "UTF-8" in reasons["g"][1]
    assert reasons["h"][0] == "malformed_record" and "not valid JSON" in reasons["h"][1]
    assert reasons["i"][0] == "empty_conversation"
    assert not marker.exists()  # .pyd/.pickle members were never decoded


def test_partitions_of_a_shard_are_cut_at_samples_and_read_the_same(tmp_path):
    shard = caption_shard(tmp_path / "s.tar", 23)
    parts = list_partitions([str(shard)], records_per_partition=5)
    assert [p.kind for p in parts] == ["wds"] * 5 and [p.first_row for p in parts] == [0, 5, 10, 15, 20]
    whole = [r.sample_id for r in _read([shard], records_per_partition=1000)]
    cut = [r.sample_id for p in parts for r in iter_records(p)]
    assert cut == whole == [f"s.tar:{k:06d}" for k in range(23)]


def test_brace_patterns_and_folders_expand_to_the_shards_in_order(tmp_path):
    for j in range(3):
        caption_shard(tmp_path / f"shard-{j:03d}.tar", 2, start=10 * j)
    braces = _read([tmp_path / "shard-{000..002}.tar"])
    assert [r.sample_id for r in braces] == [f"shard-{j:03d}.tar:{10 * j + k:06d}" for j in range(3) for k in range(2)]
    assert [r.sample_id for r in _read([tmp_path])] == [r.sample_id for r in braces]
    assert len(_read([tmp_path / "shard-{000,002}.tar"])) == 4


def _offset_of(shard: Path, member: str) -> tuple[int, int]:
    with tarfile.open(shard) as tar:
        m = tar.getmember(member)
        return m.offset, m.offset_data


def test_a_truncated_or_garbled_shard_drops_what_it_cannot_read_with_reasons(tmp_path):
    shard = caption_shard(tmp_path / "cut.tar", 4)
    data = shard.read_bytes()
    _, inside_image = _offset_of(shard, "000003.jpg")
    shard.write_bytes(data[:inside_image + 100])  # an interrupted download
    got = _read([shard])
    assert [type(r).__name__ for r in got] == ["TextRecord"] * 3 + ["Dropped"]
    assert got[-1].sample_id == "cut.tar:000003" and got[-1].reason == "malformed_record"
    assert "truncated" in got[-1].detail
    header, _ = _offset_of(caption_shard(tmp_path / "g.tar", 4), "000002.txt")
    garbled = bytearray((tmp_path / "g.tar").read_bytes())
    garbled[header:header + 512] = b"\x07" * 512
    (tmp_path / "g.tar").write_bytes(bytes(garbled))
    got = _read([tmp_path / "g.tar"])
    assert [r.sample_id for r in got] == ["g.tar:000000", "g.tar:000001", "g.tar:000002", f"g.tar:@{header}"]
    assert [type(r).__name__ for r in got] == ["TextRecord"] * 2 + ["Dropped"] * 2
    for cut in (header, header + 100):  # cut at a header, or inside one
        (tmp_path / "h.tar").write_bytes(bytes(garbled[:cut]))
        assert [r.sample_id for r in _read([tmp_path / "h.tar"])][-2:] == ["h.tar:000002", f"h.tar:@{header}"]
    (tmp_path / "bad.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(Exception, match="not a"):
        _read([tmp_path / "bad.tar"])


# ---- documents ----------------------------------------------------------------------------------


def test_documents_are_told_from_chats_and_checked(tmp_path):
    assert is_document({"texts": ["a", None], "images": [None, "x.png"]})
    assert is_document({"text": "plain"})
    assert not is_document({"texts": [{"user": "q", "assistant": "a"}]})  # the_cauldron: a chat
    assert not is_document({"messages": [], "text": "x"})
    (tmp_path / "x.png").write_bytes(image("red"))
    rec = build_document({"texts": ["A cat.", None, "", "It sleeps."], "images": [None, "x.png", None, None]},
                         sample_id="d", image_root=str(tmp_path))
    assert rec.segments == ("A cat.", IMAGE, "It sleeps.") and rec.images == (image("red"),)
    with pytest.raises(SampleError, match="'texts' has 2 entries but 'images' has 1") as e:
        build_document({"texts": ["a", None], "images": [None]}, sample_id="d", image_root=str(tmp_path))
    assert e.value.reason == "malformed_record"
    with pytest.raises(SampleError, match="position 0 has both"):
        build_document({"texts": ["a"], "images": ["x.png"]}, sample_id="d", image_root=str(tmp_path))
    with pytest.raises(SampleError, match="no text") as e:
        build_document({"texts": [None], "images": ["x.png"]}, sample_id="d", image_root=str(tmp_path))
    assert e.value.reason == "empty_conversation"
    with pytest.raises(SampleError) as e:
        build_document({"texts": ["a", None], "images": [None, "../x.png"]}, sample_id="d",
                       image_root=str(tmp_path / "sub"))
    assert e.value.reason in ("image_path_escape", "missing_image")


def test_parquet_and_jsonl_documents_read_with_images_in_place(tmp_path):
    files = write_documents(tmp_path)
    got = {r.sample_id: r for r in _read(files.values())}
    a = got["doc-a"]
    assert a.kind == "document" and a.segments == ("A red thing.", IMAGE, "Then green.", IMAGE)
    assert a.images == (image("red"), image("green"))
    assert isinstance(got["doc-b"], Dropped) and got["doc-b"].reason == "malformed_record"
    assert got["web.jsonl:0"].segments == ("A short web page.",)


def test_save_to_disk_documents(tmp_path):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    ds = pytest.importorskip("datasets")
    ds.disable_progress_bars()
    features = ds.Features({"texts": ds.List(ds.Value("string")), "images": ds.List(ds.Image())})
    data = {"texts": [["Hello", None], [None, "World"]],
            "images": [[None, {"bytes": image("red"), "path": None}], [{"bytes": image("blue"), "path": None}, None]]}
    ds.Dataset.from_dict(data, features=features).save_to_disk(str(tmp_path / "saved"))
    got = _read([tmp_path / "saved"])
    assert [r.segments for r in got] == [("Hello", IMAGE), (IMAGE, "World")]
    assert Image.open(io.BytesIO(got[1].images[0])).getpixel((0, 0)) == (0, 0, 255)


# ---- building -----------------------------------------------------------------------------------


def test_caption_layouts_loss_on_the_caption_and_end_of_text_only(tekken):
    rec = TextRecord("s:0", "caption", (IMAGE, "A red square"), (image("red"),))
    tok = get_builder(_config(tekken)).tokenizer
    eos, img = tok.convert_tokens_to_ids(["</s>", "[IMG]"])
    plain = get_builder(_config(tekken)).build(rec)
    caption = tok("A red square", add_special_tokens=False)["input_ids"]
    assert plain.input_ids.tolist() == [img] * TPI + caption + [eos]
    assert plain.loss_mask.tolist() == [0] * TPI + [1] * (len(caption) + 1)
    assert plain.image_tokens == (TPI,) and plain.images == rec.images
    prompted = get_builder(_config(tekken, caption_template="Look: {image}A photo of {caption}",
                                   bos_token="<s>")).build(rec)
    text = tok.decode(prompted.input_ids.tolist())
    assert text == "<s>Look: " + "[IMG]" * TPI + "A photo of A red square</s>"
    assert tok.decode(prompted.input_ids[prompted.loss_mask == 1].tolist()) == "A red square</s>"
    with pytest.raises(ConfigError, match=r"\{image\} and \{caption\} once each"):
        PretrainConfig(caption_template="{caption} only")


@pytest.mark.slow  # builds its own tokenizer (tekken: ~5 s each)
def test_a_tokenizer_without_eos_needs_one_named(tekken_dir):
    b = get_builder(SampleConfig(str(tekken_dir), tokens_per_image=TPI, image_token="[IMG]",
                                 pretrain=PretrainConfig()))
    with pytest.raises(ConfigError, match="--eos-token"):
        b.build(TextRecord("s:0", "caption", (IMAGE, "x"), (image("red"),)))
    with pytest.raises(ConfigError, match="no chat template, which chat records need"):
        from wdspack.packer.sources import Record
        b.build(Record("c", ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}), ()))


def test_document_loss_on_every_text_token_and_images_in_place(tekken):
    b = get_builder(_config(tekken))
    tok, img = b.tokenizer, b.image_token_id
    rec = TextRecord("d", "document", ("A cat.", IMAGE, "It sleeps."), (image("red"),))
    s = b.build(rec)
    assert tok.decode(s.input_ids.tolist()) == "A cat." + "[IMG]" * TPI + "It sleeps.</s>"
    assert (s.loss_mask == (s.input_ids != img)).all()
    bad = TextRecord("d", "document", ("A cat.", IMAGE), (b"not an image",))
    with pytest.raises(SampleError) as e:
        b.build(bad)
    assert e.value.reason == "unreadable_image"


def _long_document(paragraphs: int = 12) -> TextRecord:
    text = "\n\n".join(f"Paragraph {p} starts. " + " ".join(f"w{p}_{w}" for w in range(12)) + "."
                       for p in range(paragraphs))
    return TextRecord("long", "document", (text, IMAGE, "After the image."), (image("red"),))


@pytest.mark.parametrize("seq_len", [64, 100, 250])
def test_split_pieces_fit_lose_nothing_and_prefer_paragraphs(tekken, seq_len):
    b = get_builder(_config(tekken, split_long_documents=True))
    rec = _long_document()
    whole = get_builder(_config(tekken)).build(rec)
    pieces = build_samples(b, rec, seq_len=seq_len, max_images=None)
    assert len(pieces) > 1 and [p.sample_id for p in pieces] == [f"long#{k}" for k in range(len(pieces))]
    assert all(p.token_count <= seq_len for p in pieces)
    joined = np.concatenate([p.input_ids for p in pieces])
    assert joined.tolist() == whole.input_ids.tolist()  # no <s> for tekken: pieces are the whole, cut
    assert np.concatenate([p.loss_mask for p in pieces]).tolist() == whole.loss_mask.tolist()
    assert sum(p.image_count for p in pieces) == 1
    texts = [b.tokenizer.decode(p.input_ids.tolist()) for p in pieces]
    assert all(t.endswith("</s>") == (k == len(texts) - 1) for k, t in enumerate(texts))
    if seq_len >= 100:  # room for a paragraph: every cut is at a paragraph break or the image
        assert all(t.endswith(("\n\n", ".")) or "[IMG]" in t for t in texts[:-1])


def test_split_respects_max_images_and_bos(tekken):
    b = get_builder(_config(tekken, split_long_documents=True, bos_token="<s>"))
    rec = TextRecord("imgs", "document", ("one", IMAGE, "two", IMAGE, "three", IMAGE, "four"),
                     tuple(image(c) for c in ("red", "green", "blue")))
    pieces = build_samples(b, rec, seq_len=4096, max_images=1)
    assert [p.image_count for p in pieces] == [1, 1, 1] or [p.image_count for p in pieces] == [0, 1, 1, 1]
    assert all(p.input_ids[0] == 1 and p.loss_mask[0] == 0 for p in pieces)  # <s> starts each piece


def test_unsplittable_or_unsplit_documents_are_too_long(tekken, tmp_path):
    b = get_builder(_config(tekken, split_long_documents=True))
    no_space = TextRecord("blob", "document", ("x" * 4000,), ())
    with pytest.raises(SampleError, match="no text boundary") as e:
        build_samples(b, no_space, seq_len=64, max_images=None)
    assert e.value.reason == "too_long"
    with pytest.raises(ConfigError, match=r"only wdspack\.packer\.text\.build_samples returns"):
        b.build(_long_document())  # the one-sample path cannot split: loud, not a silent too_long


# ---- end to end ---------------------------------------------------------------------------------


def _pack_argv(tekken_dir, sources, out, *extra) -> list[str]:
    return ["pack", *map(str, sources), "--output", str(out), "--tokenizer", str(tekken_dir), "--image-token",
            "[IMG]", "--tokens-per-image", str(TPI), "--eos-token", "</s>", "--seq-len", "128", "--max-images", "4",
            "--shard-packs", "3", "--max-drop-fraction", "1", "--quiet",
            *extra]


def _packed_ids(folder: Path) -> list[str]:
    from wdspack.format.dataset import iter_dataset_packs

    manifest, root = open_dataset(str(folder))
    return [sid for _, pack in iter_dataset_packs(manifest, root) for sid in pack.sample_ids]


@pytest.mark.slow
def test_pack_captions_and_documents_split_verify_and_repeat_byte_for_byte(tekken_dir, tmp_path, capsys):
    for j in range(2):
        caption_shard(tmp_path / f"cap-{j}.tar", 7, start=100 * j)
    files = write_documents(tmp_path)
    sources = [tmp_path / "cap-{0..1}.tar", files["parquet"], files["jsonl"]]
    out = tmp_path / "packed"
    assert main(_pack_argv(tekken_dir, sources, out, "--split-long-documents",
                           "--caption-template", "{image}Caption: {caption}")) == 0
    printed = capsys.readouterr().out
    dropped = {json.loads(x)["id"]: json.loads(x)["reason"] for x in (out / "dropped.jsonl").read_text().splitlines()}
    assert dropped == {"doc-b": "malformed_record", "web.jsonl:2": "too_long"}, printed
    assert verify_dataset(str(out), sources=[str(s) for s in sources]) == []
    from wdspack.format.dataset import open_dataset
    from wdspack.format.pack import decode_pack

    manifest, _ = open_dataset(str(out))
    ids = []
    for shard in manifest.shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar:
                pack = decode_pack(tar.extractfile(m).read())
                ids += pack.sample_ids
                assert pack.num_tokens <= 128 and pack.num_images <= 4
    pieces = sorted(i for i in ids if i.startswith("web.jsonl:1#"))
    assert len(pieces) >= 3 and "web.jsonl:1" not in ids
    assert {f"cap-{j}.tar:{100 * j + k:06d}" for j in range(2) for k in range(7)} <= set(ids)
    # same inputs, same bytes; and a run with two workers
    again = tmp_path / "again"
    assert main(_pack_argv(tekken_dir, sources, again, "--split-long-documents", "--workers", "2",
                           "--caption-template", "{image}Caption: {caption}")) == 0
    assert read_files(again) == read_files(out)
    # without the option the long document is dropped whole, with its reason
    plain = tmp_path / "plain"
    assert main(_pack_argv(tekken_dir, sources, plain, "--caption-template", "{image}Caption: {caption}")) == 0
    reasons = {json.loads(x)["id"]: json.loads(x)["reason"] for x in (plain / "dropped.jsonl").read_text().splitlines()}
    assert reasons["web.jsonl:1"] == "too_long"
    assert verify_dataset(str(plain), sources=[str(s) for s in sources]) == []


def test_splitting_jobs_resume_to_the_same_bytes(tekken_dir, tmp_path, monkeypatch):
    files = write_documents(tmp_path)
    sources = [str(files["jsonl"]), str(files["parquet"])]
    cfg = _config(tekken_dir, split_long_documents=True)
    config = PackConfig(seq_len=128, max_images=4, shard_max_packs=2, records_per_partition=1,
                        run=RunOptions(max_drop_fraction=1))
    pack_dataset(sources, tmp_path / "ok", sample_config=cfg, config=config)
    assert any("#1" in sid for sid in _packed_ids(tmp_path / "ok")), "a document was split"
    pack_interrupted_then_resumed(monkeypatch, sources, tmp_path / "crashy", interrupt_at=3, sample_config=cfg,
                                  config=config)
    assert read_files(tmp_path / "crashy") == read_files(tmp_path / "ok")


def test_verify_understands_pieces_and_finds_a_missing_one():
    seen = {"doc": 1, "other": 1}
    assert _check_sources_sets(seen, packed={"doc#0", "doc#2", "other"}, dropped={"doc#1"}) == []
    missing = _check_sources_sets(seen, packed={"doc#0", "doc#2", "other"}, dropped=set())
    assert len(missing) == 1 and "pieces" in missing[0] and "doc" in missing[0]
    twice = _check_sources_sets(seen, packed={"doc#0", "doc", "other"}, dropped=set())
    assert any("pieces" in p for p in twice)
    stray = _check_sources_sets(seen, packed={"nodoc#0", "doc", "other"}, dropped=set())
    assert any("not in the sources" in p for p in stray)


def _check_sources_sets(seen, *, packed, dropped):
    from unittest import mock

    from wdspack.ops import verify

    class _P:
        pass

    records = [TextRecord(sid, "document", ("x",)) for sid in seen]
    with mock.patch("wdspack.packer.sources.list_partitions", return_value=[_P()]), \
            mock.patch("wdspack.packer.sources.iter_records", return_value=records):
        return verify._check_sources(["x"], None, set(packed), set(dropped))


def test_pack_dataset_reads_captions_without_a_chat_template(tekken_dir, tmp_path):
    caption_shard(tmp_path / "c.tar", 5)
    out = tmp_path / "out"
    summary = pack_dataset([str(tmp_path / "c.tar")], out, sample_config=_config(tekken_dir),
                           config=PackConfig(seq_len=256, max_images=8))
    assert summary.samples_packed == 5 and summary.images == 5
    assert verify_dataset(str(out), sources=[str(tmp_path / "c.tar")]) == []


@pytest.mark.slow  # moto's S3 server
def test_caption_shards_on_s3_read_like_local(tmp_path):
    pytest.importorskip("s3fs")
    from tests.support.s3server import running_s3

    for j in range(2):
        caption_shard(tmp_path / f"s-{j}.tar", 3, start=10 * j)
    local = [(r.sample_id, r.segments, r.images) for r in _read([tmp_path / "s-{0..1}.tar"])]
    (tmp_path / "s3").mkdir()
    with running_s3(tmp_path / "s3", "wds") as (_, fs):
        for j in range(2):
            fs.put_file(str(tmp_path / f"s-{j}.tar"), f"wds/caps/s-{j}.tar")
        remote = [(r.sample_id, r.segments, r.images) for r in _read(["s3://wds/caps/s-{0..1}.tar"])]
    assert remote == local and len(local) == 6


def test_many_files_are_listed_in_the_jobs_tasks(tmp_path, tekken_dir):
    """A job of many files cuts them into partitions in its tasks (a spawn pool here), not in the
    driver: the same partitions, in the same order, as listing them here; the packed bytes are equal."""
    from wdspack.packer.executors import run_tasks

    folder = tmp_path / "shards"
    folder.mkdir()
    for s in range(4):
        caption_shard(folder / f"{s:05d}.tar", 7, start=7 * s)
    (folder / "extra.jsonl").write_text(json.dumps({"id": "j0", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) + "\n")
    calls = []

    def pooled(fn, tasks):
        calls.append(len(tasks))
        return run_tasks(fn, tasks, workers=2)

    here = list_partitions([str(folder / "*.tar"), str(folder / "extra.jsonl")], records_per_partition=3)
    there = list_partitions([str(folder / "*.tar"), str(folder / "extra.jsonl")], records_per_partition=3,
                            map_files=pooled)
    assert calls == [5] and there == here and len(here) == 4 * 3 + 1

    outs = []
    for workers in (1, 2):
        out = tmp_path / f"packed{workers}"
        pack_dataset([str(folder / "*.tar")], out, sample_config=_config(tekken_dir),
                     config=PackConfig(seq_len=256, max_images=4, records_per_partition=3,
                                       run=RunOptions(workers=workers)))
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()})
    assert outs[0] == outs[1] and any(n.endswith(".tar") for n in outs[0])
