"""Packed training is exact: loss and gradients of a packed batch equal those of its sub-samples
run one by one (tiny causal transformer, float64, SDPA with the 4-D block-diagonal mask,
position ids restarting per sub-sample, a stand-in vision projection for image tokens)."""

from __future__ import annotations

import io

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from wdspack.codec import Pack
from wdspack.collate import collate_packs, pack_to_example
from wdspack.images import make_image_transform

IMG, PAD, V, D, L, M, S = 10, 0, 40, 16, 24, 2, 8


class TinyVLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        p = lambda *shape: torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3)  # noqa: E731
        self.tok, self.pos, self.vision = p(V, D), p(L, D), p(3 * S * S, D)
        self.layers = torch.nn.ParameterList([p(D, 3 * D) for _ in range(2)] + [p(D, D) for _ in range(2)])
        self.out = p(D, V)

    def forward(self, ids, positions, mask, images=None):
        """ids/positions [B, T]; mask [B, 1, T, T] bool; images: list of (row, token positions, pixels)."""
        x = self.tok[ids] + self.pos[positions]
        for row, where, pixels in images or ():
            x[row, where] = pixels.reshape(-1).to(torch.float64) @ self.vision
        for qkv_w, o_w in zip(self.layers[:2], self.layers[2:]):
            q, k, v = (x @ qkv_w).split(D, dim=-1)
            split = lambda t: t.view(t.shape[0], t.shape[1], 2, D // 2).transpose(1, 2)  # noqa: E731
            a = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
            x = x + torch.tanh(a.transpose(1, 2).reshape(x.shape) @ o_w)
        return x @ self.out


def _loss(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")


def _image(color):
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), color).save(buf, format="PNG")
    return buf.getvalue()


def _packs():
    rng = np.random.default_rng(0)
    a = np.array([1, 3, IMG, IMG, IMG, 5, 4, 22, 23, 2])       # sub-sample with one 3-token image
    b = np.array([1, 3, 15, 4, 30, 31, 32, 2])                  # text only
    c = np.array([1, 3, IMG, IMG, 7, IMG, IMG, 4, 33, 2])       # two images of 2 tokens
    d = rng.integers(11, V, 7)
    mask = lambda n, k: np.r_[np.zeros(n - k), np.ones(k)].astype(np.uint8)  # noqa: E731
    p1 = Pack(np.r_[a, b], np.r_[mask(10, 3), mask(8, 4)], (10, 8), ("a", "b"), (_image((250, 0, 0)),), (0,), (3,))
    p2 = Pack(np.r_[c, d], np.r_[mask(10, 2), mask(7, 7)], (10, 7), ("c", "d"),
              (_image((0, 250, 0)), _image((0, 0, 250))), (0, 0), (2, 2))
    return [p1, p2]


def _image_slots(ids_row, owner_start, counts, pixels):
    """Positions of each image's tokens: the image tokens of its sub-sample, in order."""
    where = (ids_row == IMG).nonzero().flatten()
    where = where[where >= owner_start]
    out, k = [], 0
    for c, px in zip(counts, pixels):
        out.append((where[k:k + c], px))
        k += c
    return out


def test_packed_equals_one_by_one():
    transform = make_image_transform(size=S)
    packs = _packs()
    batch = collate_packs([pack_to_example(p, seq_len=L, max_images=M, pad_token_id=PAD, image_transform=transform)
                           for p in packs], attention_mask="4d")
    model = TinyVLM()
    images = []
    for bi, p in enumerate(packs):
        starts = np.cumsum((0,) + p.seq_lens)
        for s in range(p.num_samples):
            slots = [j for j in range(M) if batch["image_mask"][bi * M + j] and batch["image_sample_idx"][bi * M + j] == s]
            counts = [int(batch["image_token_counts"][bi * M + j]) for j in slots]
            pix = [batch["pixel_values"][bi * M + j] for j in slots]
            for where, px in _image_slots(batch["input_ids"][bi, starts[s]:starts[s + 1]], 0, counts, pix):
                images.append((bi, where + int(starts[s]), px))
    packed = _loss(model(batch["input_ids"], batch["position_ids"], batch["attention_mask"], images), batch["labels"])
    packed.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    total, n_targets = 0.0, 0
    for p in packs:
        starts = np.cumsum((0,) + p.seq_lens)
        for s in range(p.num_samples):
            ids = torch.as_tensor(p.input_ids[starts[s]:starts[s + 1]].astype(np.int64))[None]
            lab = ids.clone()
            lab[0, torch.as_tensor(p.loss_mask[starts[s]:starts[s + 1]]) == 0] = -100
            lab[0, 0] = -100
            n_targets += int((lab != -100).sum())
            T = ids.shape[1]
            own = [j for j, o in enumerate(p.image_sample) if o == s]
            pix = transform([p.images[j] for j in own], max_images=len(own), seq_len=T)["pixel_values"]
            imgs = [(0, where, px) for where, px in
                    _image_slots(ids[0], 0, [p.image_tokens[j] for j in own], list(pix))]
            causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
            total = total + _loss(model(ids, torch.arange(T)[None], causal, imgs), lab)
    total.backward()
    assert n_targets == int((batch["labels"] != -100).sum()) > 0
    assert len(images) == 3
    torch.testing.assert_close(packed, total, rtol=1e-10, atol=1e-10)
    for g_packed, p in zip(packed_grads, model.parameters()):
        torch.testing.assert_close(g_packed, p.grad, rtol=1e-9, atol=1e-10)
    assert model.vision.grad.abs().sum() > 0, "image tokens reached the loss"
