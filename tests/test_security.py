"""Security (DESIGN §6): no code path unpickles shard bytes, credentials never leak, image bombs
are refused before decoding — in the packer and in the loader."""

from __future__ import annotations

import io
import logging
import re
import tarfile
import traceback
from pathlib import Path

import numpy as np
import pytest
from PIL import PngImagePlugin

from tests.support.bad_input import bomb_png
from tests.support.synthetic import write_dataset
from wdspack import cli
from wdspack.errors import FormatError, OutputError, SampleError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import Pack, encode_pack
from wdspack.loader import PackedDataset
from wdspack.media.image.pixels import ImageTooLargeError, decode_image, make_image_transform
from wdspack.ops.verify import verify_dataset

PACKAGE = Path(__file__).resolve().parents[1] / "wdspack"
SECRET = "hf_SECRETtokenDoNotLeak0123456789"
OTHER_SECRET = "hf_OTHERsecretFromTheCommandLine42"

# -- (a) nothing unpickles ---------------------------------------------------------------------------

_FORBIDDEN = {
    "pickle.load": r"\b(c?pickle|dill|cloudpickle|joblib)\.loads?\(",
    "Unpickler": r"\bUnpickler\(",
    "torch.load": r"\btorch\.load\(",
    "np.load with allow_pickle": r"allow_pickle\s*=\s*True",
    "marshal.loads": r"\bmarshal\.loads?\(",
    "yaml.load (unsafe)": r"\byaml\.(unsafe_)?load\(",
    "eval(": r"(?<![\w.])eval\(",
    "exec(": r"(?<![\w.])exec\(",
}


def test_no_code_path_unpickles_or_evals():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 10
    found = []
    for path in sources:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in _FORBIDDEN.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


class _Evil:
    """Unpickling this creates ``marker``: proof that someone unpickled the bytes."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def evil_dataset(tmp_path) -> tuple[Path, Path]:
    import pickle

    marker = tmp_path / "PWNED"
    root = tmp_path / "ds"
    write_dataset(root, shards=2, packs_per_shard=3)
    (root / "dropped.jsonl").write_text("")
    payload = pickle.dumps(_Evil(marker))
    pickle.loads(payload)  # the payload is live: it does create the marker
    assert marker.exists()
    marker.unlink()
    shard = root / "train-000000.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    evil = []
    for ext in ("pyd", "pth", "pickle", "pkl"):
        info = tarfile.TarInfo(f"000000000000.{ext}")
        info.size = len(payload)
        evil.append((info, payload))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in [*evil[:2], members[0], *evil[2:], *members[1:]]:
            tar.addfile(info, io.BytesIO(data))
    return root, marker


def test_pickle_members_are_never_unpickled_by_the_loader(evil_dataset):
    root, marker = evil_dataset
    ds = PackedDataset(root, shuffle=False)
    got = list(ds)
    assert len(got) == 6 and not marker.exists()
    assert ds.stats["ignored_members"] == 4 and ds.stats["corrupt_packs"] == 0


def test_loader_and_verify_apply_one_rule_to_foreign_members(evil_dataset, caplog):
    root, marker = evil_dataset
    with caplog.at_level("WARNING", logger="wdspack.loader"):
        assert len(list(PackedDataset(root, shuffle=False))) == 6  # skip: warned and counted, packs intact
    warned = [r.getMessage() for r in caplog.records if "is not a pack" in r.getMessage()]
    assert len(warned) == 4 and all("only regular '{key}.mp' pack members" in w for w in warned)
    with pytest.raises(FormatError, match=r"member '000000000000\.pyd' is not a pack"):
        list(PackedDataset(root, shuffle=False, on_corrupt="raise"))
    problems = verify_dataset(str(root))
    assert sum("is not a pack; a wdspack shard holds only" in p for p in problems) == 4
    assert not marker.exists()


def test_pickle_members_are_never_unpickled_by_verify_and_inspect(evil_dataset, capsys):
    root, marker = evil_dataset
    assert cli.main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert not marker.exists()
    for ext in ("pyd", "pth", "pickle", "pkl"):  # verify is strict: a foreign member is a problem
        assert f"member '000000000000.{ext}' is not a pack" in out
    assert cli.main(["inspect", str(root), "--deep", "--json"]) == 0
    assert not marker.exists()
    assert '"packs": 6' in capsys.readouterr().out


# -- (b) credentials never leak -----------------------------------------------------------------------


class _LeakyApi:
    """A Hub client that fails the way a careless one might: with the token in its error text."""

    def __init__(self, token=None, **_):
        import os

        self.token = token or os.environ.get("HF_TOKEN")

    def _fail(self, *args, **kwargs):
        logging.getLogger("huggingface_hub").debug("request failed")
        raise RuntimeError(f"401 Unauthorized: Authorization: Bearer {self.token} was rejected")

    create_repo = create_branch = list_repo_tree = create_commit = _fail


@pytest.fixture
def packed(tmp_path) -> Path:
    root = tmp_path / "packed"
    write_dataset(root, shards=1, packs_per_shard=2)
    (root / "dropped.jsonl").write_text("")
    return root


def _no_secret_anywhere(texts, root: Path | None = None) -> None:
    for text in texts:
        assert SECRET not in text and OTHER_SECRET not in text, text
    for path in (root.rglob("*") if root else ()):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and OTHER_SECRET.encode() not in data, path


@pytest.mark.parametrize("argv_token", [False, True])
def test_upload_never_prints_or_logs_the_token(packed, monkeypatch, capsys, caplog, argv_token):
    import huggingface_hub

    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setattr(huggingface_hub, "HfApi", _LeakyApi)
    argv = ["upload", str(packed), "org/name"] + (["--token", OTHER_SECRET] if argv_token else [])
    with caplog.at_level(logging.DEBUG):
        code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 1 and "upload to datasets/org/name failed" in err and "***" in err
    _no_secret_anywhere([out, err, caplog.text, *(r.getMessage() for r in caplog.records)], packed)


def test_upload_exception_and_traceback_hold_no_token(packed, monkeypatch):
    from wdspack.ops.upload import upload_dataset

    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(OutputError) as e:
        upload_dataset(packed, "org/name", token=OTHER_SECRET, api=_LeakyApi(OTHER_SECRET), log=lambda s: None)
    _no_secret_anywhere([str(e.value), repr(e.value), "".join(traceback.format_exception(e.value))])
    _no_secret_anywhere([], packed)


def test_cli_help_advises_hf_token_over_the_token_flag(capsys):
    assert cli.main(["upload", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--token" in text and "HF_TOKEN" in text
    assert "prefer HF_TOKEN" in text and "visible to other users" in text


@pytest.mark.parametrize("source", ["/nonexistent/wdspack/dataset", "/nonexistent/wdspack/manifest.json",
                                    "hf://datasets/org/does-not-exist@main"])
def test_loader_errors_hold_no_token(source, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as e:
        PackedDataset(source, read={"storage_options": {"token": SECRET,
                                                         "headers": {"Authorization": f"Bearer {SECRET}"}}})
    _no_secret_anywhere([str(e.value), repr(e.value), "".join(traceback.format_exception(e.value)), caplog.text])


def test_loader_repr_holds_no_token(packed):
    ds = PackedDataset(packed, read={"storage_options": {"headers": {"Authorization": f"Bearer {SECRET}"}}})
    _no_secret_anywhere([repr(ds), str(ds.state_dict())])


# -- (c) decompression bombs are refused before decoding ----------------------------------------------


@pytest.fixture
def no_png_decoding(monkeypatch):
    """Fail loudly if any PNG pixel data is decoded."""
    decoded = []

    def load(self):
        decoded.append(self.size)
        raise AssertionError(f"decoded a {self.size} PNG")

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", load)
    return decoded


@pytest.mark.slow
@pytest.mark.parametrize("size", [(30_000, 30_000), (9_000, 9_000)])  # over Pillow's own limit / only over ours
def test_packer_refuses_bombs_by_pixel_count(tekken, pixtral_template, no_png_decoding, size):
    from wdspack.packer.samples import SampleBuilder, SampleConfig

    class Rec:
        sample_id = "bomb"
        messages = ({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "y"}]})
        images = (bomb_png(*size),)

    b = SampleBuilder(SampleConfig(tekken, chat_template=pixtral_template, tokens_per_image=4,
                                   image_token="[IMG]"))
    with pytest.raises(SampleError) as e:
        b.build(Rec())
    assert e.value.reason == "image_too_large" and no_png_decoding == []
    assert f"{size[0]}x{size[1]}" in str(e.value) or "decompression bomb" in str(e.value).lower()


@pytest.mark.parametrize("size", [(30_000, 30_000), (9_000, 9_000)])
def test_loader_refuses_bombs_by_pixel_count(no_png_decoding, size):
    with pytest.raises(ImageTooLargeError):
        decode_image(bomb_png(*size))
    assert no_png_decoding == []


def test_a_bomb_inside_a_pack_is_a_counted_skip(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    write_dataset(root, shards=1, packs_per_shard=3, max_images=2)
    shard = root / "train-000000.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    pack = Pack(np.array([1002, 3, 3, 3, 3, 7, 8], np.uint16), np.array([0, 0, 0, 0, 0, 1, 1], np.uint8), (7,),
                ("bomb",), images=(bomb_png(9_000, 9_000),), image_sample=(0,), image_tokens=(4,))
    data = encode_pack(pack, token_dtype="<u2")
    info = members[2][0]
    info.size = len(data)
    members[2] = (info, data)
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, d in members:
            tar.addfile(m, io.BytesIO(d))
    decoded = []
    real_load = PngImagePlugin.PngImageFile.load
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load",
                        lambda self: decoded.append(self.size) or real_load(self))
    ds = PackedDataset(root, shuffle=False, image_transform=make_image_transform(size=16))
    got = list(ds)
    # the bomb's sample is dropped from its pack (issue #47), the pack served once, as padding: it held only it
    assert len(got) == 3 and ds.stats["dropped_samples"] == ds.stats["dropped_samples/ds/image_too_large"] == 1
    assert ds.stats["corrupt_packs"] == 0 and int(got[2]["num_samples"]) == 0
    assert (9_000, 9_000) not in decoded
    assert read_manifest(root).num_packs == 3
