"""``model_inputs(batch, model, logits="targets")``: the LM head and the loss on the target positions only.

For every family the loader feeds (Gemma 3 too), the tiny real model on the loader's one-row batches gives
the same loss (the model's own) and the same gradients of every parameter as with every position's
logits, while its logits hold exactly the positions whose next token is a target. Float64 models; the
model's own loss is float32 (transformers upcasts the logits to it), summed in another order here.
"""

from __future__ import annotations

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError

TOLERANCE = {"rtol": 1e-6, "atol": 1e-9}


def _step(model, batch, logits):
    model.zero_grad()
    kwargs = wdspack.model_inputs(batch, model, logits=logits)
    out = model(**kwargs)
    out.loss.backward()
    return out, kwargs, [p.grad.clone() if p.grad is not None else None for p in model.parameters()]


@pytest.mark.parametrize("name", [*sorted(set(h.FAMILIES) - {"mistral3_sliding"}), "gemma3"])
def test_target_logits_give_the_same_loss_and_gradients(vlm_family, name):
    processor, model, dataset = vlm_family(name)
    model = model.double()
    batches = list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, processor=processor))
    # the first two packs: between them an image and a pack of several chats (the head's path is the same for
    # every pack; the later ones add no case)
    batches = batches[:2]
    assert len(batches) == 2 and any(bool(b["image_mask"].any()) for b in batches)
    assert any(int(b["seq_idx"].max()) > 0 for b in batches), "a pack of several chats"
    for batch in batches:
        full, _, want = _step(model, batch, "all")
        kept, kwargs, got = _step(model, batch, "targets")
        targets = batch["labels"][0, 1:] != -100
        assert kept.logits.shape[:2] == (1, int(targets.sum())) < full.logits.shape[:2]
        # the kept logits are the full ones at the positions before each target (to the matmul's rounding:
        # the head multiplies fewer rows, blocked another way)
        torch.testing.assert_close(kept.logits[0], full.logits[0, :-1][targets], rtol=1e-12, atol=1e-12)
        assert kwargs["logits_to_keep"].device.type == kwargs["shift_labels"].device.type == "cpu"
        torch.testing.assert_close(kept.loss, full.loss, **TOLERANCE)
        seen = 0
        for (pname, _), g, w in zip(model.named_parameters(), got, want):
            assert (g is None) == (w is None), pname
            if w is not None:
                torch.testing.assert_close(g, w, **TOLERANCE, msg=lambda m, pname=pname: f"gradient of {pname}: {m}")
                seen += int(w.abs().sum() > 0)
        assert seen > 10, "gradients reached the model"


def test_rows_and_models_without_logits_to_keep_are_refused(vlm_family):
    processor, model, dataset = vlm_family("qwen2_5_vl")
    batch = next(iter(wdspack.make_loader(str(dataset), batch_size=2, num_workers=0, shuffle=False,
                                          processor=processor)))
    with pytest.raises(ConfigError, match=r"one row; this one has labels of shape \(2, 96\).*padding_free=True"):
        wdspack.model_inputs(batch, model, logits="targets")
    with pytest.raises(ConfigError, match=r"logits='every': use one of 'all', 'targets'"):
        wdspack.model_inputs(batch, model, logits="every")
    one = next(iter(wdspack.make_loader(str(dataset), batch_size=2, num_workers=0, shuffle=False,
                                        processor=processor, padding_free=True)))
    assert wdspack.model_inputs(one, model, logits="targets")["logits_to_keep"].ndim == 1
    compiled = torch.compile(model)  # built lazily: nothing compiles until it is called
    assert wdspack.model_inputs(one, compiled, logits="targets")["shift_labels"].shape[0] == 1

    class NoKeep(type(model)):
        def forward(self, input_ids=None, labels=None, **kwargs):
            return super().forward(input_ids=input_ids, labels=labels, **kwargs)

    model.__class__ = NoKeep
    with pytest.raises(ConfigError, match=r"NoKeep.forward takes no logits_to_keep.*logits='all'"):
        wdspack.model_inputs(one, model, logits="targets")
