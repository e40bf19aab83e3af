"""Packed training is exact: loss and gradients of a packed batch equal those of its sub-samples run
one by one.

Two packs, five sub-samples (one text-only sub-sample trained from its first token, so a target
across a boundary would show; four images of 1 to 3 tokens in three sub-samples; padding in
both packs), built by
hand with ``codec.Pack``. Checked in float64 on CPU with:

* a tiny VLM (absolute and rotary positions from ``position_ids``, a stand-in vision projection whose outputs
  replace the image-token embeddings in slot order) under every attention the batch supports:
  SDPA with the 4-D bool mask, eager attention with the additive float mask, varlen attention
  over ``cu_seqlens`` (what flash-attn's varlen kernel computes), the padding-free row, and flex
  attention over ``seq_idx`` (forward only: no CPU backward);
* a tiny ``transformers`` Llama, fed ``position_ids`` only (its packed-sequence detection), the
  padding-free row, the 4-D mask, and its own loss from the unshifted ``labels``.
"""

from __future__ import annotations

import io
import itertools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from wdspack.format.pack import Pack
from wdspack.loader.batch.collate import collate_packs, pack_to_example
from wdspack.media.image.pixels import make_image_transform

IMG, PAD, V, D, HEADS = 10, 0, 48, 16, 2
L, M, S = 24, 3, 8  # seq_len, max_images, image side
TRANSFORM = make_image_transform(size=S)


def _image(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 14), color).save(buf, format="PNG")
    return buf.getvalue()


def _tail_mask(n: int, k: int) -> np.ndarray:
    return np.r_[np.zeros(n - k), np.ones(k)].astype(np.uint8)


def _packs() -> list[Pack]:
    rng = np.random.default_rng(0)
    a = np.array([1, 3, IMG, IMG, IMG, 5, 4, 22, 23, 2])      # one image of 3 tokens
    b = np.array([1, 3, 15, 4, 30, 31, 32, 2])                 # text
    c = np.array([1, 3, IMG, 7, IMG, IMG, 4, 33, 2, 5])       # two images, of 1 and 2 tokens
    d = rng.integers(11, V, 7)                                 # trained from its first token
    e = np.array([1, IMG, IMG, IMG, 41, 2])                   # one image of 3 tokens
    p1 = Pack(np.r_[a, b], np.r_[_tail_mask(10, 3), _tail_mask(8, 4)], (10, 8), ("a", "b"),
              (_image((250, 0, 0)),), (0,), (3,))
    p2 = Pack(np.r_[c, d, e], np.r_[_tail_mask(10, 2), np.ones(7), _tail_mask(6, 2)].astype(np.uint8), (10, 7, 6),
              ("c", "d", "e"), (_image((0, 250, 0)), _image((0, 0, 250)), _image((90, 90, 90))),
              (0, 0, 2), (1, 2, 3))
    return [p1, p2]


def _sub_samples(packs):
    """Each sub-sample alone: (id, input_ids, labels, images, image token counts)."""
    for p in packs:
        starts = np.cumsum((0,) + p.seq_lens)
        for s, sid in enumerate(p.sample_ids):
            ids = torch.as_tensor(p.input_ids[starts[s]:starts[s + 1]].astype(np.int64))
            labels = torch.where(torch.as_tensor(p.loss_mask[starts[s]:starts[s + 1]]) == 1, ids, -100)
            labels[0] = -100  # alone, the first token has nothing to be predicted from
            own = [j for j, o in enumerate(p.image_sample) if o == s]
            yield sid, ids, labels, [p.images[j] for j in own], [p.image_tokens[j] for j in own]


def _token_sample_ids(batch, packs, padding_free: bool) -> list[list[str | None]]:
    """The sub-sample id of every batch position (None for padding)."""
    if padding_free:
        names = [sid for p in packs for sid in p.sample_ids]
        return [[names[i] if i < len(names) else None for i in batch["seq_idx"][0].tolist()]]
    return [[p.sample_ids[i] if i < p.num_samples else None for i in row]
            for p, row in zip(packs, batch["seq_idx"].tolist())]


# --- a tiny VLM -----------------------------------------------------------------------------------

def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    freq = 1.0 / (100.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angle = positions[:, None, :, None].to(torch.float64) * freq  # [R, 1, T, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)


class TinyVLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def param(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3)

        self.tok, self.out, self.pos = param(V, D), param(D, V), param(L, D)
        self.vision, self.vision_pos = param(3 * S * S, D), param(4, D)
        self.qkv = torch.nn.ParameterList([param(D, 3 * D) for _ in range(2)])
        self.proj = torch.nn.ParameterList([param(D, D) for _ in range(2)])

    def image_features(self, pixels: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """One embedding per image token: a projection of the pixels plus the token's index in its image."""
        base = pixels.flatten(1).to(torch.float64) @ self.vision
        starts = torch.cumsum(counts, 0) - counts
        within = torch.arange(int(counts.sum())) - torch.repeat_interleave(starts, counts)
        return torch.repeat_interleave(base, counts, dim=0) + self.vision_pos[within]

    def forward(self, ids, positions, attend, pixels, counts):
        x = self.tok[ids] + self.pos[positions]  # absolute positions too: rotary alone is shift-invariant
        feats = self.image_features(pixels, counts)
        x = x.masked_scatter((ids == IMG)[..., None], feats)  # image slots fill image tokens in order
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = (x @ qkv).split(D, dim=-1)
            heads = [t.view(*t.shape[:2], HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v)]
            a = attend(_rope(heads[0], positions), _rope(heads[1], positions), heads[2])
            x = x + torch.tanh(a.transpose(1, 2).reshape(x.shape) @ proj)
        return x @ self.out


def _sdpa(mask):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _eager(additive):
    def attend(q, k, v):
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + additive
        return scores.softmax(-1) @ v
    return attend


def _varlen(cu_seqlens):
    """What ``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, ..., causal=True)`` computes."""
    def attend(q, k, v):
        R, H, T, d = q.shape
        flat = [t.transpose(0, 1).reshape(H, R * T, d) for t in (q, k, v)]
        bounds = cu_seqlens.tolist()
        assert bounds[-1] == R * T
        outs = [F.scaled_dot_product_attention(*(t[:, s:e] for t in flat), is_causal=True)
                for s, e in itertools.pairwise(bounds)]
        return torch.cat(outs, dim=1).reshape(H, R, T, d).transpose(0, 1)
    return attend


def _flex(seq_idx):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def rule(b, h, q, kv):
        return (seq_idx[b, q] == seq_idx[b, kv]) & (kv <= q)

    R, T = seq_idx.shape
    block = create_block_mask(rule, R, None, T, T, device="cpu")
    return lambda q, k, v: flex_attention(q, k, v, block_mask=block)


def _token_losses(logits, labels):
    """Loss of the target ``labels[:, i + 1]`` predicted at position ``i`` (the Hugging Face shift)."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none")


def _reference(model, packs):
    """Per-sample loss sums, target count and the gradients of the mean loss, one sub-sample at a time."""
    sums, count = {}, 0
    for sid, ids, labels, images, counts in _sub_samples(packs):
        pixels = TRANSFORM(images)["pixel_values"]
        T = ids.shape[0]
        logits = model(ids[None], torch.arange(T)[None], _sdpa(torch.ones(T, T, dtype=torch.bool).tril()),
                       pixels, torch.tensor(counts, dtype=torch.int64))
        sums[sid] = _token_losses(logits, labels[None]).sum()
        count += int((labels != -100).sum())
    model.zero_grad()
    mean = sum(sums.values()) / count
    mean.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return {k: v.detach() for k, v in sums.items()}, count, mean.detach(), grads


def _batch(packs, **collate_kw):
    examples = [pack_to_example(p, seq_len=L, max_images=M, pad_token_id=PAD, image_transform=TRANSFORM) for p in packs]
    return collate_packs(examples, **collate_kw)


def _images(batch):
    mask = batch["image_mask"]
    return batch["pixel_values"][mask], batch["image_token_counts"][mask]


VARIANTS = {
    "sdpa-4d-bool": (dict(attention_mask="4d"), lambda b: _sdpa(b["attention_mask"])),
    "eager-4d-additive": (dict(attention_mask="4d", mask_dtype=torch.float64), lambda b: _eager(b["attention_mask"])),
    "varlen-cu_seqlens": ({}, lambda b: _varlen(b["cu_seqlens"])),
    "padding-free-varlen": (dict(padding_free=True), lambda b: _varlen(b["cu_seqlens"])),
    "padding-free-4d": (dict(padding_free=True, attention_mask="4d"), lambda b: _sdpa(b["attention_mask"])),
    "padding-free-tight": (dict(padding_free=True, pad_to=None), lambda b: _varlen(b["cu_seqlens"])),
}


@pytest.fixture(scope="module")
def reference():
    model = TinyVLM()
    packs = _packs()
    return model, packs, _reference(model, packs)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_equals_one_by_one(reference, variant):
    model, packs, (ref_sums, ref_count, ref_mean, ref_grads) = reference
    collate_kw, attention = VARIANTS[variant]
    batch = _batch(packs, **collate_kw)
    pixels, counts = _images(batch)
    logits = model(batch["input_ids"], batch["position_ids"], attention(batch), pixels, counts)
    losses = _token_losses(logits, batch["labels"])
    count = int((batch["labels"] != -100).sum())
    mean = losses.sum() / count
    model.zero_grad()
    mean.backward()

    assert count == ref_count > 0 and len(counts) == 4
    torch.testing.assert_close(mean.detach(), ref_mean, rtol=1e-12, atol=1e-12)
    owners = _token_sample_ids(batch, packs, collate_kw.get("padding_free", False))
    real = batch["image_mask"]
    slot_owner = [packs[b].sample_ids[s] for b, s in zip(batch["image_pack_idx"][real].tolist(),
                                                          batch["image_sample_idx"][real].tolist())]
    token_owner = [o for row, ids in zip(owners, batch["input_ids"].tolist()) for o, t in zip(row, ids) if t == IMG]
    assert token_owner == [o for o, c in zip(slot_owner, counts.tolist()) for _ in range(c)], "slot ownership"
    for sid, want in ref_sums.items():
        got = sum(losses[r, i - 1] for r, row in enumerate(owners) for i, o in enumerate(row) if o == sid and i > 0)
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12, msg=f"sub-sample {sid}")
    for (name, p), want in zip(model.named_parameters(), ref_grads):
        torch.testing.assert_close(p.grad, want, rtol=1e-9, atol=1e-12, msg=f"gradient of {name}")
    assert model.vision.grad.abs().sum() > 0, "image tokens reached the loss"
    model.zero_grad()


def test_flex_attention_over_seq_idx_matches_forward(reference):
    model, packs, (_, _, ref_mean, _) = reference
    batch = _batch(packs)
    pixels, counts = _images(batch)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # flex attention warns that it runs unfused without torch.compile
        logits = model(batch["input_ids"], batch["position_ids"], _flex(batch["seq_idx"]), pixels, counts)
    mean = _token_losses(logits, batch["labels"]).sum() / int((batch["labels"] != -100).sum())
    torch.testing.assert_close(mean, ref_mean, rtol=1e-12, atol=1e-12)


def test_naive_concatenation_is_not_exact(reference):
    """The checks above can fail: one causal sequence per row (no boundaries) gives another loss."""
    model, packs, (_, _, ref_mean, _) = reference
    batch = _batch(packs)
    pixels, counts = _images(batch)
    with torch.no_grad():
        logits = model(batch["input_ids"], torch.arange(L).expand(2, L), _sdpa(torch.ones(L, L).tril().bool()),
                       pixels, counts)
    mean = _token_losses(logits, batch["labels"]).sum() / int((batch["labels"] != -100).sum())
    assert not torch.allclose(mean, ref_mean, rtol=1e-6)


# --- a real transformers model --------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * L * 2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.float64)
        vision = torch.nn.Linear(3 * S * S, 32, dtype=torch.float64)
    model.eval()  # no dropout
    return model, vision


def _llama_step(model, vision, ids, pixels, counts, **kw):
    embeds = model.get_input_embeddings()(ids)
    feats = torch.repeat_interleave(vision(pixels.flatten(1).to(torch.float64)), counts, dim=0)
    embeds = embeds.masked_scatter((ids == IMG)[..., None], feats)
    return model(inputs_embeds=embeds, use_cache=False, **kw)  # with a cache, packing is not detected


@pytest.mark.parametrize("layout", ["position_ids", "padding_free", "4d-bool", "4d-additive-eager"])
def test_transformers_llama_packed_equals_one_by_one(llama, layout):
    model, vision = llama
    params = list(model.parameters()) + list(vision.parameters())
    packs = _packs()
    total, count = 0, 0
    for _, ids, labels, images, counts in _sub_samples(packs):
        logits = _llama_step(model, vision, ids[None], TRANSFORM(images)["pixel_values"],
                             torch.tensor(counts, dtype=torch.int64)).logits
        total = total + _token_losses(logits, labels[None]).sum()
        count += int((labels != -100).sum())
    ref_mean = total / count
    ref_grads = torch.autograd.grad(ref_mean, params)

    kw = {"padding_free": True} if layout == "padding_free" else {"attention_mask": "4d"} if layout == "4d-bool" \
        else {"attention_mask": "4d", "mask_dtype": torch.float64} if layout == "4d-additive-eager" else {}
    batch = _batch(packs, **kw)
    model.set_attn_implementation("eager" if layout == "4d-additive-eager" else "sdpa")
    try:
        pixels, counts = _images(batch)
        out = _llama_step(model, vision, batch["input_ids"], pixels, counts, position_ids=batch["position_ids"],
                          attention_mask=batch.get("attention_mask"), labels=batch["labels"])
    finally:
        model.set_attn_implementation("sdpa")
    mean = _token_losses(out.logits, batch["labels"]).sum() / int((batch["labels"] != -100).sum())
    tol = 1e-6 if layout == "4d-additive-eager" else 1e-12  # Llama's eager softmax runs in float32
    torch.testing.assert_close(mean, ref_mean, rtol=tol, atol=tol)
    # The model's own loss (it shifts the unshifted labels itself; computed in float32) agrees too.
    torch.testing.assert_close(out.loss.double(), ref_mean.detach(), rtol=1e-5, atol=1e-6)
    for g, want in zip(torch.autograd.grad(mean, params), ref_grads):
        torch.testing.assert_close(g, want, rtol=max(tol, 1e-9), atol=tol)
