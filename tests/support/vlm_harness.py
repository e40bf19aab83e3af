"""The same proof for every model family: tokens, pixels, exact loss and gradients, training.

A family's test module builds its real processor and a tiny random-init model of its real class
(``examples/tiny_vlm``), then calls these:

* :func:`pack_chats` writes :data:`CHATS` (images of several sizes in several sub-samples, two
  images in one sub-sample, text-only and multi-turn chats) as a messages JSONL with PNG files and
  packs it with ``SampleConfig(processor=<saved processor folder>)``: at least two packs, padding.
* :func:`check_tokens`: every sub-sample in the shards equals ``processor.apply_chat_template(...,
  tokenize=True)`` with the images, and its loss mask is exactly the assistant turns.
* :func:`reference` / :func:`packed`: loss sum, target count and parameter gradients of the
  sub-samples run one by one through the plain processor → model path, and of the loader's batch
  through ``model(**wdspack.model_inputs(batch, model))``; :func:`assert_same` compares them
  (float64; the loss is recomputed in float64 from the logits, since transformers' own loss upcasts
  to float32 only).
* :func:`train_steps`: a few AdamW steps on loader batches; the loss falls.
* :func:`check_flex`: the same comparison under FlexAttention, for the classes that support it.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]

import wdspack  # noqa: E402
from wdspack.format.pack import decode_pack  # noqa: E402
from wdspack.models import save_processor  # noqa: E402

__all__ = ["CHATS", "assert_same", "check_flex", "check_flex_gradients", "check_tokens", "check_training",
           "dataset_sub_samples", "flex_main_kernel", "oracle", "pack_chats", "pack_sample_ids", "packed",
           "packed_and_reference", "reference", "train_steps", "with_a_long_chat"]

#: (id, turns, image sizes (width, height)). A turn is (role, text); "<image>" in a user text marks
#: where an image goes.
CHATS: tuple[tuple[str, tuple[tuple[str, str], ...], tuple[tuple[int, int], ...]], ...] = (
    ("img-wide", (("user", "<image>What is in the picture?"), ("assistant", "A red square on grey.")), ((96, 56),)),
    ("text-only", (("user", "What is two plus two?"), ("assistant", "Four."),
                   ("user", "And three plus three?"), ("assistant", "Six, since three and three make six.")), ()),
    ("two-images", (("user", "Compare <image> with <image> please."),
                    ("assistant", "The first is wider; the second is taller and greener.")), ((64, 40), (36, 70))),
    ("img-tall", (("user", "<image>Describe it."), ("assistant", "A tall blue bar."),
                  ("user", "Anything else?"), ("assistant", "Nothing else.")), ((44, 100),)),
    ("short-text", (("user", "Say hi."), ("assistant", "Hi!")), ()),
)


def _png(size: tuple[int, int], seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def chat_images(chat) -> list[bytes]:
    """The chat's PNG images (random pixels, seeded by the chat's id)."""
    return [_png(size, seed=sum(map(ord, chat[0])) + k) for k, size in enumerate(chat[2])]


def _messages(chat, images: Sequence[Any] | None = None) -> list[dict]:
    """The chat as HF messages; with ``images``, each image part carries its image (the oracle's input)."""
    pool = iter(images) if images is not None else None
    out = []
    for role, text in chat[1]:
        parts: list[dict] = []
        for k, piece in enumerate(text.split("<image>")):
            if k:
                parts.append({"type": "image", **({"image": next(pool)} if pool is not None else {})})
            if piece:
                parts.append({"type": "text", "text": piece})
        out.append({"role": role, "content": parts})
    return out


def pack_chats(folder: Path, processor: Any, *, seq_len: int, max_images: int = 4,
               chats: Sequence = CHATS, processor_dir: Path | None = None) -> Path:
    """Write ``chats`` (messages JSONL + PNGs), save ``processor`` (in ``folder / "processor"``, unless
    ``processor_dir`` holds it saved already) and pack with it; return the dataset."""
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    src = folder / "src"
    (src / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for chat in chats:
        names = []
        for k, data in enumerate(chat_images(chat)):
            name = f"images/{chat[0]}-{k}.png"
            (src / name).write_bytes(data)
            names.append(name)
        msgs = _messages(chat)
        for m in msgs:
            for part in m["content"]:
                if part["type"] == "image":
                    part["image"] = names.pop(0)
        lines.append(json.dumps({"id": chat[0], "messages": msgs}))
    (src / "chats.jsonl").write_text("\n".join(lines) + "\n")
    proc_dir = processor_dir if processor_dir is not None else save_processor(processor, folder / "processor")
    out = folder / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(out), sample_config=SampleConfig(processor=str(proc_dir)),
                           config=PackConfig(seq_len=seq_len, max_images=max_images, on_error="raise"),
                           progress=False)
    assert summary.samples_packed == len(chats), summary.lines()
    return out


def dataset_sub_samples(dataset: Path) -> dict[str, tuple[np.ndarray, np.ndarray, list[bytes], list[int]]]:
    """``id -> (input_ids, loss_mask, images, image_tokens)`` of every sub-sample in the shards."""
    import tarfile

    out = {}
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                pack = decode_pack(tar.extractfile(member).read())
                starts = np.cumsum((0,) + pack.seq_lens)
                for s, sid in enumerate(pack.sample_ids):
                    own = [j for j, o in enumerate(pack.image_sample) if o == s]
                    out[sid] = (pack.input_ids[starts[s]:starts[s + 1]].astype(np.int64),
                                pack.loss_mask[starts[s]:starts[s + 1]],
                                [pack.images[j] for j in own], [pack.image_tokens[j] for j in own])
    return out


def pack_sample_ids(dataset: Path) -> list[tuple[str, ...]]:
    """The sub-sample ids of every pack, shard by shard, in stored order."""
    import tarfile

    out = []
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            out += [decode_pack(tar.extractfile(m).read()).sample_ids for m in tar.getmembers()]
    return out


def check_inspect(dataset: Path, packs: Sequence[dict[str, int]], capsys: Any) -> dict[str, Any]:
    """``wdspack inspect --deep`` on ``dataset`` against what each pack holds: ``packs`` gives, per pack, its counts
    by inspect's per-pack names (``tokens``, ``samples``, ``images``, ``videos``, ``frames``, ``video_tokens``: the
    processor's, never the pack's). The JSON's totals, fill and per-pack spread of each name are theirs, and the
    text names the totals; the JSON stats."""
    from wdspack.cli import main

    assert main(["inspect", str(dataset), "--deep", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    total = {key: sum(p[key] for p in packs) for key in packs[0]}
    assert (stats["packs"], stats["samples"], stats["tokens"]) == (len(packs), total["samples"], total["tokens"])
    assert stats["fill_ratio"] == round(total["tokens"] / (len(packs) * stats["seq_len"]), 6)
    for key in ("images", "videos"):
        assert stats.get(key, 0) == total[key], key
    if total["videos"]:
        assert stats["max_video_tokens_per_pack"] == max(p["video_tokens"] for p in packs)
    for key in packs[0]:
        values = np.asarray([p[key] for p in packs])
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        want = {"min": int(values.min()), "mean": round(float(values.mean()), 3), "max": int(values.max()),
                "p50": float(p50), "p90": float(p90), "p99": float(p99)}
        assert stats["per_pack"][key] == want, (key, stats["per_pack"][key], want)
    assert main(["inspect", str(dataset), "--deep"]) == 0
    text = capsys.readouterr().out
    assert f"tokens    {total['tokens']}  images {total['images']}  " in text, text
    assert f"  videos {total['videos']} " in text if total["videos"] else "videos" not in text, text
    return stats


def oracle(processor: Any, chat) -> dict[str, torch.Tensor]:
    """The plain path: the processor's own ``apply_chat_template`` with the chat's PIL images."""
    pil = [Image.open(io.BytesIO(b)) for b in chat_images(chat)]
    kwargs = dict(tokenize=True, return_dict=True, return_tensors="pt")
    try:
        return dict(processor.apply_chat_template(_messages(chat, pil), **kwargs))
    except AttributeError:
        if getattr(processor, "video_processor", False) is not None:
            raise
    # Built without its video processor (no torchvision), a class whose override reads that processor's
    # defaults before delegating (SmolVLM: num_frames/fps, video kwargs only) fails; for image chats the
    # base it delegates to is the same path.
    from transformers.processing_utils import ProcessorMixin

    return dict(ProcessorMixin.apply_chat_template(processor, _messages(chat, pil), **kwargs))


def check_tokens(dataset: Path, processor: Any, chats: Sequence = CHATS) -> None:
    """Every sub-sample's ids are the processor's; its targets are the assistant turns' tokens."""
    subs = dataset_sub_samples(dataset)
    assert sorted(subs) == sorted(c[0] for c in chats), "every chat is packed once"
    feature = wdspack.models.family_for(processor).image.feature_token(processor)
    feature_id = processor.tokenizer.convert_tokens_to_ids(feature)
    for chat in chats:
        ids, mask, _, tokens = subs[chat[0]]
        want = oracle(processor, chat)["input_ids"][0].numpy()
        assert ids.tolist() == want.tolist(), f"{chat[0]}: tokens differ from the processor's"
        assert sum(tokens) == int((ids == feature_id).sum()) and len(tokens) == len(chat[2])
        trained = processor.tokenizer.decode(ids[mask.astype(bool)])
        for role, text in chat[1]:
            assert (text in trained) == (role == "assistant"), f"{chat[0]}: {role} turn {text!r} trained?"


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Loss of ``labels[:, i + 1]`` predicted at ``i`` (the Hugging Face shift), float64, summed."""
    return F.cross_entropy(logits[:, :-1].double().transpose(1, 2), labels[:, 1:], ignore_index=-100,
                           reduction="sum")


def reference(model: Any, processor: Any, dataset: Path, chats: Sequence = CHATS,
              extra: Callable[[dict], dict] | None = None, *, backward: bool = True
              ) -> tuple[torch.Tensor, int, list[torch.Tensor] | None]:
    """Loss sum, target count and gradients (``None`` without ``backward``) of the sub-samples one by
    one (processor → model)."""
    subs = dataset_sub_samples(dataset)
    model.zero_grad()
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for chat in chats:
        inputs = oracle(processor, chat)
        ids, mask = subs[chat[0]][:2]
        labels = torch.where(torch.from_numpy(mask.astype(bool)), torch.from_numpy(ids), -100)[None].to(device)
        labels[0, 0] = -100
        inputs = {k: v.to(device) for k, v in inputs.items() if k != "attention_mask"}
        if extra is not None:
            inputs = extra(inputs)
        with torch.set_grad_enabled(backward):
            logits = model(**inputs, use_cache=False).logits
        loss = _token_losses(logits, labels)
        if backward:
            loss.backward()
        total, count = total + loss.detach(), count + int((labels[:, 1:] != -100).sum())
    return total, count, _gradients(model) if backward else None


def _gradients(model: Any) -> list[torch.Tensor]:
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad()
    return grads


def packed(model: Any, batches: Sequence[dict], *, backward: bool = True
           ) -> tuple[torch.Tensor, int, list[torch.Tensor] | None]:
    """The same from loader batches through ``model(**wdspack.model_inputs(batch, model))``."""
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device), 0
    for batch in batches:
        kwargs = wdspack.model_inputs(batch, model)
        with torch.set_grad_enabled(backward):
            out = model(**kwargs)
        loss = _token_losses(out.logits, kwargs["labels"])
        if backward:
            loss.backward()
        total, count = total + loss.detach(), count + int((kwargs["labels"][:, 1:] != -100).sum())
        own = out.loss.detach().double()  # the model's own (float32) loss over the same targets
        torch.testing.assert_close(own, loss.detach() / int((kwargs["labels"][:, 1:] != -100).sum()),
                                   rtol=1e-5, atol=1e-5)
    return total, count, _gradients(model) if backward else None


#: The gradients' tolerance under eager attention where a test states it (the audio families'): the text models'
#: eager attention rounds its softmax to float32, and scores that differ in their last float64 bits between a pack
#: and a sub-sample alone (the BLAS's summation order for another matrix size, with one thread) round apart there;
#: the gradients then differ by up to ~1e-5 relative on small entries (measured 1.6e-5 on one embedding row, 8e-7 on
#: the audio towers; Qwen3-Omni's router softmax is float32 too), where SDPA (float64 throughout) agrees to 1e-9.
#: A wrong mask moves them by far more; the loss keeps the strict tolerance.
EAGER_GRADIENTS = ("", 1e-4, 1e-8)


def assert_same(model: Any, got, want, *, rtol: float = 1e-9, atol: float = 1e-11,
                looser: tuple[str, float, float] | Sequence[tuple[str, float, float]] | None = None) -> None:
    """Equal mean loss and, where both carry them, equal mean gradients of every parameter (those whose name holds
    ``looser``'s text to its own ``(rtol, atol)``; ``looser`` may be several such, the first that matches counts)."""
    (g_total, g_count, g_grads), (w_total, w_count, w_grads) = got, want
    assert g_count == w_count > 0
    torch.testing.assert_close(g_total / g_count, w_total / w_count, rtol=rtol, atol=atol)
    if g_grads is None and w_grads is None:
        return
    loosers = () if looser is None else (looser,) if isinstance(looser[0], str) else tuple(looser)
    seen = 0
    for (name, _), g, w in zip(model.named_parameters(), g_grads, w_grads):
        r, a = next(((lr, la) for text, lr, la in loosers if text in name), (rtol, atol))
        torch.testing.assert_close(g / g_count, w / w_count, rtol=r, atol=a,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")
        seen += int(w.abs().sum() > 0)
    assert seen > len(w_grads) // 2, "most parameters got a gradient"


def loader_batches(dataset: Path, processor: Any, **kw: Any) -> list[dict]:
    """All batches of one epoch, every pack in one batch, unshuffled, in this process."""
    packs = sum(s.packs for s in wdspack.read_manifest(dataset / "manifest.json").shards)
    loader = wdspack.make_loader(str(dataset), batch_size=int(packs), num_workers=0, shuffle=False, processor=processor,
                                 **kw)
    return list(loader)


def packed_and_reference(model: Any, processor: Any, dataset: Path, *, attn: str, seq_len: int,
                         chats: Sequence = CHATS, backward: bool = True) -> tuple[tuple, tuple]:
    """``(packed, reference)`` of :func:`packed` / :func:`reference` under attention ``attn``
    (the loader's batches must hold padding: a pack shorter than ``seq_len``)."""
    model.set_attn_implementation(attn)
    try:
        want = reference(model, processor, dataset, chats=chats, backward=backward)
        batches = loader_batches(dataset, processor)
        assert any(int(n) < seq_len for b in batches for n in b["num_tokens"]), "a pack has padding"
        return packed(model, batches, backward=backward), want
    finally:
        model.set_attn_implementation("sdpa")


def check_flex(model: Any, processor: Any, dataset: Path, *, seq_len: int, monkeypatch: Any,
               chats: Sequence = CHATS, rtol: float = 1e-9, atol: float = 1e-11) -> None:
    """Packed and one-by-one losses agree under FlexAttention (the model's ``flex_attention``
    implementation fed the ``BlockMask`` built from the batch), on CPU in float64, forward only.

    On CPU, torch's FlexAttention has no backward (``NotImplementedError``) and its compiled kernel
    takes no float64, so transformers' compiled wrapper is swapped for the uncompiled
    ``flex_attention`` (same mask, same math, materialised scores); on CUDA (tests marked ``gpu``)
    the model's own compiled path runs with gradients, see :func:`check_flex_gradients`; transformers'
    ``BlockMask`` builders run uncompiled too (:func:`uncompiled_block_masks`).
    """
    import transformers.integrations.flex_attention as tfa
    from torch.nn.attention.flex_attention import flex_attention

    def uncompiled(query, key, value, training=False, **kwargs):
        with warnings.catch_warnings():  # "called without torch.compile()": on purpose here
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(tfa, "compile_friendly_flex_attention", uncompiled)
    uncompiled_block_masks(monkeypatch)
    got, want = packed_and_reference(model, processor, dataset, attn="flex_attention", seq_len=seq_len, chats=chats,
                                     backward=False)
    assert_same(model, got, want, rtol=rtol, atol=atol)


def uncompiled_block_masks(monkeypatch: Any) -> None:
    """transformers' ``BlockMask`` builders called uncompiled: the same blocks, without a dynamo compilation of
    ``create_block_mask`` per chat length (under cProfile: 36 s of a 74-s Gemma 3 check, 58 of a 66-s SmolVLM one)."""
    import transformers.integrations.flex_attention as tfa
    import transformers.masking_utils as masks
    from torch.nn.attention.flex_attention import create_block_mask

    def uncompiled(*args: Any, _compile: bool = False, **kwargs: Any) -> Any:  # transformers passes True
        return create_block_mask(*args, **kwargs)

    for module in (tfa, masks):
        monkeypatch.setattr(module, "create_block_mask", uncompiled)


def small_head_dims(model: Any) -> dict[str, int]:
    """The text stack's attention layers whose head dim is under 16 (what the compiled FlexAttention
    kernel refuses on CUDA), by module name."""
    text = model.config.get_text_config()
    return {name: int(m.head_dim) for name, m in model.named_modules()
            if getattr(m, "config", None) is text and isinstance(getattr(m, "head_dim", None), int) and m.head_dim < 16}


def check_flex_gradients(model: Any, processor: Any, dataset: Path, *, seq_len: int, chats: Sequence = CHATS) -> None:
    """Loss and gradients under the model's compiled FlexAttention on CUDA, float32 (the compiled kernel
    needs head dims of at least 16 where the model's text stack uses it: Gemma 3, LLaVA and Mistral 3 pass a
    ``head_dim=16`` build of their tiny model)."""
    import copy

    small = small_head_dims(model)
    assert not small, f"the compiled FlexAttention kernel needs head dims >= 16; build with head_dim=16: {small}"
    gpu = copy.deepcopy(model).to("cuda", torch.float32)
    with flex_main_kernel() as calls:
        got, want = packed_and_reference(gpu, processor, dataset, attn="flex_attention", seq_len=seq_len, chats=chats)
    assert calls, "the model ran FlexAttention"
    assert_same(gpu, got, want, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def flex_main_kernel() -> Iterator[list[dict]]:
    """transformers' compiled FlexAttention told to keep to torch's main kernel
    (``kernel_options={"FORCE_USE_FLEX_ATTENTION": True}``); yields the kernel options of each call.

    For a query under 128 tokens torch picks its decoding kernel, whose tile for grouped-query heads is
    ``next_power_of_2(query length × heads per KV head)``; over 128 it no longer divides the mask's
    128-token blocks, every configuration is filtered out, and Inductor raises ``NoValidChoicesError``
    (pytorch/pytorch#185349). SmolVLM's one-by-one chats of 66-119 tokens with 2 heads per KV head met
    it on an H200 with torch 2.11. Training never wants the decoding kernel.
    """
    import transformers.integrations.flex_attention as tfa

    original, calls = tfa.compile_friendly_flex_attention, []

    def main_kernel(*args: Any, kernel_options: dict | None = None, **kwargs: Any) -> Any:
        options = dict(kernel_options or {})
        if "BACKEND" not in options:  # torch refuses both knobs at once
            options.setdefault("FORCE_USE_FLEX_ATTENTION", True)
        calls.append(options)
        return original(*args, kernel_options=options, **kwargs)

    tfa.compile_friendly_flex_attention = main_kernel
    try:
        yield calls
    finally:
        tfa.compile_friendly_flex_attention = original


def check_training(model: Any, dataset: Path, processor: Any, *, dtype: torch.dtype | None = None) -> list[float]:
    """:func:`train_steps` on a copy of ``model`` (in ``dtype``); the last losses are below the first."""
    import copy

    trained = copy.deepcopy(model)
    losses = train_steps(trained if dtype is None else trained.to(dtype), dataset, processor)
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    return losses


def train_steps(model: Any, dataset: Path, processor: Any, *, steps: int = 6, lr: float = 3e-3) -> list[float]:
    """``steps`` AdamW steps on loader batches (1 pack each, 1 worker process); the losses."""
    loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=1, processor=processor, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses: list[float] = []
    batches = iter(())
    while len(losses) < steps:
        batch = next(batches, None)
        if batch is None:
            batches = iter(list(loader))
            continue
        loss = model(**wdspack.model_inputs(batch, model)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


#: The families by name -> (tiny_vlm module, processor options, model options, seq_len). Gemma 3 is apart from
#: :data:`FAMILIES` (varlen refuses it), but :func:`build_family` builds it too.
ALL_FAMILIES = {
    "qwen2_5_vl": ("qwen2_5_vl", {"cls": "Qwen2_5_VLProcessor"}, {"cls": "Qwen2_5_VLForConditionalGeneration"}, 96),
    "qwen2_vl": ("qwen2_5_vl", {"cls": "Qwen2VLProcessor"}, {"cls": "Qwen2VLForConditionalGeneration"}, 96),
    "qwen3_vl": ("qwen3_vl", {}, {}, 80),
    "smolvlm": ("smolvlm", {"cls": "SmolVLMProcessor"}, {"cls": "SmolVLMForConditionalGeneration"}, 192),
    "idefics3": ("smolvlm", {"cls": "Idefics3Processor"}, {"cls": "Idefics3ForConditionalGeneration"}, 192),
    "llava": ("llava", {"kind": "llava"}, {}, 96),
    "llava_onevision": ("llava", {"kind": "llava_onevision"}, {}, 96),
    "mistral3": ("mistral3", {}, {}, 96),
    "mistral3_sliding": ("mistral3", {}, {"sliding_window": 8}, 96),
    "gemma3": ("gemma3", {}, {}, 128),
    "glm4v": ("glm4v", {"cls": "Glm4vProcessor"}, {}, 96),  # GLM-4.6V: its model and tower (test_family_glm4v.py)
    "internvl": ("internvl", {}, {}, 96),
    "minicpmv4_6": ("minicpmv", {}, {}, 128),
}
#: The families the loader feeds under the varlen kernel (all but Gemma 3).
FAMILIES = {name: spec for name, spec in ALL_FAMILIES.items() if name not in ("gemma3", "minicpmv4_6")}


def with_a_long_chat(processor, seq_len: int) -> tuple:
    """The harness's chats and a text-only one whose answer alone takes half a pack's tokens (a pack
    holding one long sample)."""
    words = "the long answer goes on and on about packing".split()
    text, n = "", 0
    while len(processor.tokenizer(text, add_special_tokens=False)["input_ids"]) < seq_len // 2:
        n += 1
        text = " ".join(words[k % len(words)] for k in range(n))
    return (*CHATS, ("long-text", (("user", "Tell me everything."), ("assistant", text)), ()))


def build_family(name: str, folder: Path, *, chats: Sequence | Callable[[Any, int], Sequence] = CHATS,
                 processors: TinyProcessors | None = None) -> tuple[Any, Any, Path]:
    """The real processor, the tiny model and the packed dataset of :data:`ALL_FAMILIES`' ``name``
    (``tests/conftest.py``'s ``vlm_family`` builds each once per session); ``chats``, or
    ``chats(processor, seq_len)``, are the dataset's. With ``processors`` (``tests/conftest.py``'s session-wide
    ``tiny_processors``) the processor and its saved folder are the session's, shared with every test that asks for
    the family's processor; without, built here."""
    module, proc_opts, _, seq_len = ALL_FAMILIES[name]
    if processors is not None:
        processor = processors.family(name)
        processor_dir: Path | None = processors.folder(processor)
    else:
        tok = folder / "tok"
        processor = _tiny(module).processor(folder if module == "llava" else tok, **proc_opts)
        processor_dir = None
    model = family_model(name, processor)
    dataset = pack_chats(folder, processor, seq_len=seq_len,
                         chats=chats(processor, seq_len) if callable(chats) else chats, processor_dir=processor_dir)
    return processor, model, dataset


def family_model(name: str, processor: Any) -> Any:
    """A fresh tiny model of :data:`ALL_FAMILIES`' ``name`` (its model options, seed 0) for ``processor``."""
    module, _, model_opts, _ = ALL_FAMILIES[name]
    return _tiny(module).model(processor, **model_opts)


def _tiny(module: str) -> Any:
    import importlib

    return importlib.import_module(f"tiny_vlm.{module}")


class TinyProcessors:
    """``examples/tiny_vlm``'s real processors, each built once per (module, options) and saved once
    (``tests/conftest.py``'s session fixture ``tiny_processors``): shared by every test that asks for the same one,
    so never change one, or write into its folder. Two builds with the same options are the same processor (the
    tokenizer a copy of the one tiny_vlm extends once per process; the folder a build is given only receives the
    tekken file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Any] = {}
        self._folders: dict[int, Path] = {}

    def get(self, module: str, **options: Any) -> Any:
        """``tiny_vlm.<module>.processor(folder, **options)``, built at the first ask."""
        build = _tiny(module).processor
        signature = inspect.signature(build)
        named = signature.bind(None, **options)
        named.apply_defaults()  # the options as the build sees them: a default given or left out, the same processor
        folder = next(iter(signature.parameters))
        key = f"{module}{sorted((k, v) for k, v in named.arguments.items() if k != folder)!r}"
        if key not in self._built:
            where = self.root / f"{module}-{len(self._built)}"
            self._built[key] = build(where / "tok", **options)
        return self._built[key]

    def family(self, name: str) -> Any:
        """The processor of :data:`ALL_FAMILIES`' ``name`` (Mistral 3's sliding variant shares Mistral 3's)."""
        module, options, _, _ = ALL_FAMILIES[name]
        return self.get(module, **options)

    def folder(self, processor: Any) -> Path:
        """``processor`` (one of these) saved with ``wdspack.models.save_processor``, once."""
        if not any(p is processor for p in self._built.values()):
            raise ValueError("not a processor of this TinyProcessors")
        if id(processor) not in self._folders:
            self._folders[id(processor)] = save_processor(processor, self.root / f"saved-{len(self._folders)}")
        return self._folders[id(processor)]
