"""Samples: real tokenizers offline, exact token layouts and loss masks, image-token counts."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from wdspack.errors import ConfigError, SampleError
from wdspack.packer.samples import SampleBuilder, SampleConfig, get_builder


@dataclass(frozen=True)
class Rec:
    sample_id: str
    messages: tuple
    images: tuple = ()


def _img(w=64, h=48, fmt="PNG", color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format=fmt)
    return buf.getvalue()


def _user(*parts):
    return {"role": "user", "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}


def _asst(text):
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def builder(tekken_dir, pixtral_template):  # a folder: the config goes to worker processes as it is
    return get_builder(SampleConfig(str(tekken_dir), chat_template=pixtral_template, tokens_per_image=3,
                                    image_token="[IMG]"))


def _tokens(builder, sample):
    return builder.tokenizer.convert_ids_to_tokens([int(i) for i in sample.input_ids])


def test_literal_layout_and_mask(builder):
    rec = Rec("r0", (
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        _user(None, "What is it?"), _asst("A cat."), _user("And?"), _asst("Black."),
    ), (_img(),))
    s = builder.build(rec)
    toks = _tokens(builder, s)
    assert toks == ["<s>", "[SYSTEM_PROMPT]", "Be", "Ġbrief", ".", "[/SYSTEM_PROMPT]",
                    "[INST]", "[IMG]", "[IMG]", "[IMG]", "What", "Ġis", "Ġit", "?", "[/INST]",
                    "A", "Ġcat", ".", "</s>", "[INST]", "And", "?", "[/INST]", "Black", ".", "</s>"]
    trained = [t for t, m in zip(toks, s.loss_mask) if m]
    assert trained == ["A", "Ġcat", ".", "</s>", "Black", ".", "</s>"]
    assert s.images == rec.images and s.image_tokens == (3,)
    assert s.input_ids.dtype == np.uint32 and s.loss_mask.dtype == np.uint8
    assert s.token_count == len(toks) and s.image_count == 1


def test_text_only_sample(builder):
    s = builder.build(Rec("t", (_user("Hi"), _asst("Hello"))))
    assert _tokens(builder, s) == ["<s>", "[INST]", "Hi", "[/INST]", "Hello", "</s>"]
    assert s.loss_mask.tolist() == [0, 0, 0, 0, 1, 1] and s.images == ()


def test_string_content_is_accepted(builder):
    s = builder.build(Rec("s", ({"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                {"role": "assistant", "content": "Hello"})))
    assert s.loss_mask.sum() == 2


@pytest.mark.slow  # Qwen2-VL's image processor
def test_processor_counts_match_the_processor(tekken, pixtral_template):
    from transformers import Qwen2VLImageProcessor

    b = SampleBuilder(SampleConfig(tekken, chat_template=pixtral_template,
                                   tokens_per_image="processor:qwen2vl", image_token="[IMG]"))
    proc = Qwen2VLImageProcessor()
    for w, h in ((64, 48), (640, 480), (300, 1000)):
        data = _img(w, h)
        s = b.build(Rec("q", (_user(None, "x"), _asst("y")), (data,)))
        grid = proc(images=[Image.open(io.BytesIO(data))], return_tensors="np")["image_grid_thw"][0]
        assert s.image_tokens == (int(np.prod(grid)) // proc.merge_size ** 2,)
        assert int((s.input_ids == 10).sum()) == s.image_tokens[0]
    assert b.describe()["image_policy"] == {"kind": "processor", "name": "qwen2vl"}


@pytest.mark.slow  # Qwen2-VL's image processor
def test_max_image_side_downscales_deterministically(tekken, pixtral_template):
    cfg = SampleConfig(tekken, chat_template=pixtral_template, tokens_per_image="processor:qwen2vl",
                       image_token="[IMG]", max_image_side=200)
    b = SampleBuilder(cfg)
    big = _img(800, 400, fmt="JPEG")
    rec = Rec("d", (_user(None, "x"), _asst("y")), (big,))
    a, again = b.build(rec), b.build(rec)
    assert a.images == again.images and a.images[0] != big
    assert Image.open(io.BytesIO(a.images[0])).size == (200, 100)
    small = SampleBuilder(SampleConfig(tekken, chat_template=pixtral_template,
                                       tokens_per_image="processor:qwen2vl", image_token="[IMG]"))
    assert a.image_tokens == small.build(Rec("e", rec.messages, (_img(200, 100),))).image_tokens
    kept = b.build(Rec("k", rec.messages, (_img(100, 50),)))
    assert kept.images == (_img(100, 50),), "images within the limit keep their bytes"


@pytest.mark.parametrize("data, reason", [
    (b"not an image at all", "unreadable_image"),
    (_img(300, 300, fmt="JPEG")[:400], "unreadable_image"),
])
def test_bad_images(builder, data, reason):
    with pytest.raises(SampleError) as e:
        builder.build(Rec("b", (_user(None, "x"), _asst("y")), (data,)))
    assert e.value.reason == reason and "0x" not in str(e.value)


@pytest.mark.slow  # builds its own tokenizer (tekken: ~5 s each)
def test_decompression_bomb_refused_before_decoding(tekken, pixtral_template):
    b = SampleBuilder(SampleConfig(tekken, chat_template=pixtral_template, tokens_per_image=3,
                                   image_token="[IMG]", max_image_pixels=100 * 100))
    with pytest.raises(SampleError) as e:
        b.build(Rec("bomb", (_user(None, "x"), _asst("y")), (_img(200, 200),)))
    assert e.value.reason == "image_too_large" and "200x200" in str(e.value)


def test_record_level_reasons(builder):
    with pytest.raises(SampleError) as e:
        builder.build(Rec("n", (_user("only a question"),)))
    assert e.value.reason == "no_assistant_turn"
    with pytest.raises(SampleError) as e:
        builder.build(Rec("m", ()))
    assert e.value.reason == "empty_conversation"
    with pytest.raises(SampleError) as e:  # literal "[IMG]" in the text: one token too many
        builder.build(Rec("p", (_user(None, "look: [IMG]"), _asst("ok")), (_img(),)))
    assert e.value.reason == "placeholder_mismatch"


def test_config_errors(tekken, pixtral_template):
    with pytest.raises(ConfigError, match="no chat template; pass --chat-template"):
        SampleBuilder(SampleConfig(tekken, tokens_per_image=16, image_token="[IMG]"))
    with pytest.raises(ConfigError, match="'<nope>' is not a single token"):
        SampleBuilder(SampleConfig(tekken, chat_template=pixtral_template, tokens_per_image=16,
                                   image_token="<nope>"))
    with pytest.raises(ConfigError, match=r"--tokenizer '/nonexistent/tokenizer': no such folder\. Give the folder"):
        SampleBuilder(SampleConfig("/nonexistent/tokenizer", chat_template=pixtral_template, tokens_per_image=16))
    # text-only data needs no --tokens-per-image: the config takes none (a record with an image is refused)
    assert SampleConfig("/nonexistent/tokenizer", chat_template=pixtral_template).tokens_per_image is None


def test_describe_and_pickle(builder):
    d = builder.describe()
    t = d["tokenizer"]
    assert (t["vocab_size"], t["image_token"], t["image_token_id"], t["pad_token_id"], t["token_dtype"]) == (
        131072, "[IMG]", 10, 11, "<u4")
    assert len(t["chat_template_sha256"]) == 64 and d["image_policy"] == {"kind": "fixed", "tokens_per_image": 3}
    json.dumps(d)
    cfg = builder.config
    assert pickle.loads(pickle.dumps(cfg)) == cfg and get_builder(cfg) is builder


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory):
    """A tiny real tokenizer built with `tokenizers`, saved and loaded back with AutoTokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<image>"]
    words = "system user assistant hi hello what is this a cat dog you are helpful \n".split(" ")
    vocab = {t: i for i, t in enumerate(specials + sorted(set(w for w in words if w) | {"\n"}))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit()])
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }} "
        "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
        "{% if p.type == 'image' %}<image>{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
    folder = tmp_path_factory.mktemp("chatml")
    fast.save_pretrained(folder)
    return folder


def test_second_tokenizer_with_its_own_template(chatml_dir):
    b = SampleBuilder(SampleConfig(str(chatml_dir), tokens_per_image=2))  # image token found in the vocab
    s = b.build(Rec("c", (_user(None, "what is this"), _asst("a cat")), (_img(),)))
    toks = b.tokenizer.convert_ids_to_tokens([int(i) for i in s.input_ids])
    assert toks == ["<|im_start|>", "user", "<image>", "<image>", "what", "is", "this", "<|im_end|>",
                    "<|im_start|>", "assistant", "a", "cat", "<|im_end|>"]
    assert [t for t, m in zip(toks, s.loss_mask) if m] == ["a", "cat", "<|im_end|>"]
    assert b.describe()["tokenizer"]["token_dtype"] == "<u2"
