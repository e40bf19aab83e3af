"""One compile for the epoch (issue #41): the text decoder layers compiled with ``compile_decoder_layers``.

An epoch of one-pack batches whose contents differ (a text-only pack, packs of one to three images)
compiles at the first step and never again (``error_on_recompile`` from the second step on), and the
compiled model's loss and gradients are the eager model's, under SDPA and under varlen attention.
``aot_eager`` runs dynamo and AOTAutograd (what decides recompiles and graph breaks) without Inductor's
code generation, which takes a minute here; tools/bench_compile.py measures Inductor.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import wdspack
from wdspack.errors import ConfigError
from wdspack.models.compile import compile_decoder_layers, decoder_layers, traceable_kernel
from wdspack.models.varlen import reference_varlen_attn, use_varlen_attention


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava"])
def family(request, vlm_family):
    """The tiny model (each test compiles a copy) and the epoch's one-pack batches, whose image counts differ."""
    processor, model, dataset = vlm_family(request.param)
    batches = list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False,
                                       processor=processor))
    images = [int(b["image_mask"].sum()) for b in batches]
    assert 0 in images and len(set(images)) >= 2, images  # a text-only pack and packs with images
    return model, batches


def _step(model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = model(**wdspack.model_inputs(batch, model)).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _epoch(compiled, eager, batches) -> None:
    """Every batch, then the first again: compiled equals eager; no compile after the first step."""
    dynamo.reset()
    counters.clear()
    for i, batch in enumerate([*batches, batches[0]]):
        with dynamo.config.patch(error_on_recompile=i > 0):
            got, got_grads = _step(compiled, batch)
        want, want_grads = _step(eager, batch)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for (name, _), g, w in zip(eager.named_parameters(), got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # every layer shares one graph


def test_compiled_layers_compile_once_and_equal_eager(family):
    eager, batches = family
    model = copy.deepcopy(eager)
    compiled = compile_decoder_layers(model, backend="aot_eager", fullgraph=True)
    _epoch(compiled, eager, batches)


def test_varlen_layers_compile_once_and_equal_eager(family):
    """Under ``use_varlen_attention``: the compiled layers run the reference kernel as a custom op (it reads
    ``cu_seqlens`` on the host, a graph break otherwise) and are fed the row length as ``max_seqlen``; the
    eager model runs the plain reference kernel."""
    eager, batches = copy.deepcopy(family[0]), family[1]
    use_varlen_attention(eager, kernel=reference_varlen_attn)
    model = copy.deepcopy(family[0])
    use_varlen_attention(model, kernel=traceable_kernel(reference_varlen_attn))
    assert len({int(b["max_seqlen"]) for b in batches}) > 1  # a max_seqlen that would recompile per value
    _epoch(compile_decoder_layers(model, backend="aot_eager", fullgraph=True), eager, batches)


def test_the_plain_reference_kernel_breaks_the_graph(family):
    """Why the custom op: without it dynamo meets the host read of ``cu_seqlens`` (under ``fullgraph``, an error)."""
    model, batches = copy.deepcopy(family[0]), family[1]
    use_varlen_attention(model, kernel=reference_varlen_attn)
    compile_decoder_layers(model, backend="aot_eager", fullgraph=True)
    dynamo.reset()
    with pytest.raises(dynamo.exc.Unsupported, match=r"[Dd]ata dependent"):
        model(**wdspack.model_inputs(batches[0], model))


def test_compiling_twice_is_refused(family):
    model = copy.deepcopy(family[0])
    layers = decoder_layers(model)
    compile_decoder_layers(model, backend="eager")  # compiles lazily: nothing runs here
    assert all("forward" in vars(layer) for layer in layers)
    with pytest.raises(ConfigError, match="already replaced"):
        compile_decoder_layers(model, backend="eager")


def test_a_model_without_decoder_layers_is_named():
    with pytest.raises(ConfigError, match="Linear has no text decoder"):
        decoder_layers(torch.nn.Linear(2, 2))
