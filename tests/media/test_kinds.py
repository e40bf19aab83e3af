"""The media-kind protocol: every kind declared once, the shared records by kind, the v1 spellings kept."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from wdspack.errors import DROP_REASONS
from wdspack.format.pack import Pack, decode_pack, encode_pack
from wdspack.media import KINDS, Media, kind_named, spelled
from wdspack.media.video.record import VideoPlanRecord
from wdspack.models import known_families
from wdspack.packer.tokenized import Sample

PLAN = VideoPlanRecord((0, 2), (28, 28), (1, 2, 2), 1.0)


def test_each_kind_declares_names_keys_and_reasons_the_package_knows():
    assert [k.name for k in KINDS] == ["image", "video", "audio"]  # the v1 order of a pack's keys, then audio
    for kind in KINDS:
        assert kind_named(kind.name) is kind_named(kind.plural) is kind
        assert kind.keys[:3] == (kind.plural, f"{kind.name}_sample", f"{kind.name}_tokens")
        assert set(kind.drop_reasons) <= set(DROP_REASONS), kind.name
        assert set(kind.load_drop_reasons) <= set(kind.drop_reasons), kind.name
        assert kind.decode_errors() and kind.prepare is not None and kind.batch is not None and kind.extensions
    with pytest.raises(KeyError, match="no media kind 'smell'; the kinds are image, video, audio"):
        kind_named("smell")


def test_the_v1_spellings_read_and_construct_the_same_pack():
    by_kind = Pack(np.arange(6), np.ones(6, np.uint8), (6,), ("a",),
                   media={"image": Media((b"png",), (0,), (2,)), "video": Media((b"mp4",), (0,), (2,), (PLAN,))})
    by_name = Pack(np.arange(6), np.ones(6, np.uint8), (6,), ("a",), images=(b"png",), image_sample=(0,),
                   image_tokens=(2,), videos=(b"mp4",), video_sample=(0,), video_tokens=(2,), video_plans=(PLAN,))
    by_position = Pack(np.arange(6), np.ones(6, np.uint8), (6,), ("a",), (b"png",), (0,), (2,), (b"mp4",), (0,),
                       (2,), (PLAN,))
    data = encode_pack(by_kind, token_dtype="<u2")
    assert encode_pack(by_name, token_dtype="<u2") == encode_pack(by_position, token_dtype="<u2") == data
    # a pack without audio has none of its keys (its bytes are v1's)
    assert list(msgpack.unpackb(data, raw=False))[6:] == [k for k in spelled("data", "sample", "tokens", "plans")
                                                           if not k.startswith("audio")]
    back = decode_pack(data)
    assert back.media == by_kind.media and back.videos == (b"mp4",) and back.num_images == back.count("video") == 1
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['smells'\\]"):
        Pack(np.arange(1), np.ones(1, np.uint8), (1,), ("a",), smells=())


def test_a_pack_without_a_kind_that_is_not_always_stored_has_none_of_its_keys():
    text = Pack(np.arange(3), np.ones(3, np.uint8), (3,), ("a",))
    keys = list(msgpack.unpackb(encode_pack(text, token_dtype="<u2"), raw=False))
    assert "images" in keys and not any(k.startswith("video") for k in keys)
    assert decode_pack(encode_pack(text, token_dtype="<u2")).media["video"] == Media()


def test_a_sample_counts_every_kinds_media_for_the_budget_and_names_each_kind():
    s = Sample("a", np.arange(4), np.ones(4, np.uint8), images=(b"a", b"b"), image_tokens=(1, 1),
               videos=(b"v",), video_tokens=(1,), video_plans=(PLAN,))
    assert s.media_count == 3 and len(s.images) == 2 and s.media["video"].plans == (PLAN,)


def test_every_family_has_a_side_for_each_kind_it_takes_and_only_for_kinds_there_are():
    names = {kind.name for kind in KINDS}
    for family in known_families():
        assert family.sides and set(family.sides) <= names, family.name
        assert ("image" in family.sides) is (family.image is not None)
        assert ("audio" in family.sides) is (family.audio is not None)
        assert ("video" in family.sides) is (family.video is not None)
