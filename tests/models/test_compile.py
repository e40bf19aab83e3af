"""One compile for the epoch (issue #41): the text decoder layers compiled with ``compile_decoder_layers``.

For every family the loader feeds, an epoch of one-pack batches whose contents differ (a text-only pack,
packs of one to three images, a pack holding one long sample) compiles at the first step and never again
(``error_on_recompile`` from the second step on), and the compiled model's loss and gradients are the eager
model's; under SDPA for every family, under varlen attention for one of each kind (Qwen's mRoPE, LLaVA's).
Dynamo alone decides graphs, breaks and recompiles, whatever the backend: most families run its ``eager``
backend (the captured forward graph run as Python, its backward torch's autograd: every parameter's gradient
is compared at the compiling step, the loss at every step); ``aot_eager`` (dynamo and AOTAutograd, which also
traces the backward and each custom op's fake and autograd, without Inductor's code generation, which takes a
minute here) runs one family of each kind, gradients compared at every step: LLaVA's plain rope under SDPA,
Qwen2.5-VL's mRoPE under the varlen op, MiniCPM-V 4.6's linear-attention op. An epoch is the first pack of each
kind (image count, holding the long sample or not). ``python -m tools.bench_train --compile`` measures Inductor.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError
from wdspack.models.compile import compile_decoder_layers, decoder_layers, traceable_kernel
from wdspack.models.linear_attention import segment_linear_attention
from wdspack.models.varlen import reference_varlen_attn, use_varlen_attention

#: every family the loader feeds (tests/support/vlm_harness.py; Mistral 3's sliding-window variant is a config),
#: named: a family added to the harness is measured here before it joins
FAMILIES = ("gemma3", "glm4v", "idefics3", "internvl", "llava", "llava_onevision", "minicpmv4_6", "mistral3",
            "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "smolvlm")
#: the families whose SDPA epoch runs AOTAutograd too (one of each kind; Qwen2.5-VL's under varlen)
AOT = ("llava", "minicpmv4_6")
#: the models whose forward takes no ``logits_to_keep`` (their LM head runs on every position)
WHOLE_HEAD = ("MiniCPMV4_6ForConditionalGeneration",)
#: dynamo's graphs for an epoch: one per kind of decoder layer (MiniCPM-V 4.6: linear and full attention)
GRAPHS = {"minicpmv4_6": 2}


@pytest.fixture(scope="module")
def epochs(tmp_path_factory, tiny_processors):
    """``get(name) -> (model, batches)``: the tiny model (each test compiles a copy) and the epoch's one-pack
    batches, whose contents differ (the first pack of each kind: its image count, whether it holds the long
    sample); built once per family (its processor the session's)."""
    built: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in built:
            processor, model, dataset = h.build_family(name, tmp_path_factory.mktemp(name), chats=h.with_a_long_chat,
                                                       processors=tiny_processors)
            batches = list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False,
                                               processor=processor))
            seq_len = h.ALL_FAMILIES[name][3]
            kinds = {(int(b["image_mask"].sum()), int(b["max_seqlen"]) >= seq_len // 2): b for b in reversed(batches)}
            batches = [b for b in batches if any(b is kept for kept in kinds.values())]  # the first of each kind
            images = [int(b["image_mask"].sum()) for b in batches]
            assert 0 in images and len(set(images)) >= 2, images  # a text-only pack and packs with images
            assert any(long for _, long in kinds)  # the long sample's pack
            built[name] = model, batches
        return built[name]

    return get


@pytest.fixture(params=FAMILIES)
def any_family(request, epochs):
    return request.param, *epochs(request.param)


@pytest.fixture(params=["qwen2_5_vl", "llava"])
def family(request, epochs):
    """One family of each kind (Qwen's mRoPE, LLaVA's), for the varlen and API tests."""
    return request.param, *epochs(request.param)


def _step(model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and every parameter's gradient; the LM head on the target positions only where the model takes
    ``logits_to_keep`` (the same loss and gradients as the whole head, test_target_logits.py; the tiny models'
    131k-word head is most of an eager step)."""
    model.zero_grad()
    logits = "all" if type(model).__name__ in WHOLE_HEAD else "targets"
    loss = model(**wdspack.model_inputs(batch, model, logits=logits)).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _loss(model, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss alone: a forward with autograd on (as in training: dynamo guards on the grad mode), no backward."""
    logits = "all" if type(model).__name__ in WHOLE_HEAD else "targets"
    return model(**wdspack.model_inputs(batch, model, logits=logits)).loss.detach(), []


def _epoch(compiled, eager, batches, *, graphs: int = 1, every_backward: bool = True) -> None:
    """Every batch: compiled equals eager (loss, and every parameter's gradient at the first step, or at every
    step with ``every_backward``: a backend that compiles the backward); no compile after the first step."""
    dynamo.reset()
    counters.clear()
    for i, batch in enumerate(batches):
        run = _step if every_backward or i == 0 else _loss
        with dynamo.config.patch(error_on_recompile=i > 0):
            got, got_grads = run(compiled, batch)
        want, want_grads = run(eager, batch)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for (name, _), g, w in zip(eager.named_parameters(), got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])  # every layer of a kind: one graph


def test_compiled_layers_compile_once_and_equal_eager(any_family):
    name, eager, batches = any_family
    model = copy.deepcopy(eager)
    aot = name in AOT
    compiled = compile_decoder_layers(model, backend="aot_eager" if aot else "eager", fullgraph=True)
    _epoch(compiled, eager, batches, graphs=GRAPHS.get(name, 1), every_backward=aot)


def test_varlen_layers_compile_once_and_equal_eager(family):
    """Under ``use_varlen_attention``: the compiled layers run the reference kernel as a custom op (it reads
    ``cu_seqlens`` on the host, a graph break otherwise) and are fed the row length as ``max_seqlen``; the
    eager model runs the plain reference kernel. Qwen2.5-VL's runs AOTAutograd through the op."""
    name, built, batches = family
    eager = copy.deepcopy(built)
    use_varlen_attention(eager, kernel=reference_varlen_attn)
    model = copy.deepcopy(built)
    use_varlen_attention(model, kernel=traceable_kernel(reference_varlen_attn))
    assert len({int(b["max_seqlen"]) for b in batches}) > 1  # a max_seqlen that would recompile per value
    aot = name == "qwen2_5_vl"
    _epoch(compile_decoder_layers(model, backend="aot_eager" if aot else "eager", fullgraph=True), eager, batches,
           every_backward=aot)


def test_the_plain_reference_kernel_breaks_the_graph(family):
    """Why the custom op: without it dynamo meets the host read of ``cu_seqlens`` (under ``fullgraph``, an error)."""
    model, batches = copy.deepcopy(family[1]), family[2]
    use_varlen_attention(model, kernel=reference_varlen_attn)
    compile_decoder_layers(model, backend="eager", fullgraph=True)
    dynamo.reset()
    with pytest.raises((dynamo.exc.Unsupported, dynamo.exc.UserError), match=r"[Dd]ata.dependent"):
        model(**wdspack.model_inputs(batches[0], model))


def test_compiling_twice_is_refused(family):
    model = copy.deepcopy(family[1])
    layers = decoder_layers(model)
    compile_decoder_layers(model, backend="eager")  # compiles lazily: nothing runs here
    assert all("forward" in vars(layer) for layer in layers)
    with pytest.raises(ConfigError, match="already replaced"):
        compile_decoder_layers(model, backend="eager")


def test_a_model_without_decoder_layers_is_named():
    with pytest.raises(ConfigError, match="Linear has no text decoder"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_the_per_segment_loop_breaks_the_graph(epochs, monkeypatch):
    """Why MiniCPM-V 4.6's linear-attention core is an op: compiled as ``segment_linear_attention`` leaves them
    (the whole layer run once per segment), dynamo traces the loop over the offsets read on the host and cannot
    guard on the data-dependent segment bounds (under ``fullgraph``, an error; without it, a graph per layout)."""
    import wdspack.models.compile as compile_module

    built, batches = epochs("minicpmv4_6")
    model = copy.deepcopy(built)
    monkeypatch.setattr(compile_module, "traceable_linear_attention", lambda model: [])
    segment_linear_attention(model)
    compile_decoder_layers(model, backend="eager", fullgraph=True)
    dynamo.reset()
    with pytest.raises((dynamo.exc.Unsupported, dynamo.exc.UserError), match=r"[Dd]ata.dependent"):
        model(**wdspack.model_inputs(batches[0], model))


def test_linear_attention_it_cannot_split_is_refused_in_one_line():
    """Qwen3-Next's Gated DeltaNet (its q, k, v and z in one projection) is not Qwen3.5's: its layers would run once
    per sub-sample whole, so the model is refused, its layers left as they were."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                             linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                             num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                             shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"])
    model = Qwen3NextForCausalLM(config)
    with pytest.raises(ConfigError, match=r"layers \(Qwen3NextGatedDeltaNet\).*train this model eager"):
        compile_decoder_layers(model)
    assert not any("forward" in vars(m) for m in model.modules())
