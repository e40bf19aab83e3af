"""Each family's audio token count against the transformers pieces that make it, built offline from code: the
processors' own ``_process_audio`` (a real feature extractor, the processor's audio kwargs, its token
arithmetic) and their ``_get_num_audio_tokens`` / ``_compute_audio_num_tokens``, and the models'
``_get_feat_extract_output_lengths``. The processors are made without ``__init__`` (no tokenizer is needed
for the audio half); lengths sit on the 160- and 640-sample edges, at 0 and 1, and past the 30 s and 300 s cuts."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
from transformers.models.qwen2_audio.processing_qwen2_audio import Qwen2AudioProcessor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    _get_feat_extract_output_lengths as qwen3_model_lengths,
)
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

from wdspack.media.audio.tokens import (
    AUDIO_RULES,
    gemma4_audio_frames,
    gemma4_audio_tokens,
    qwen2_5_omni_frames,
    qwen2_5_omni_tokens,
    qwen2_audio_frames,
    qwen2_audio_tokens,
    qwen3_omni_frames,
    qwen3_omni_tokens,
)

#: Every length the arithmetic is compared at (cheap: no features computed).
EDGES = sorted({0, 1, 2, 159, 160, 161, 200, 201, 319, 320, 321, 480, 481, 639, 640, 641, 1279, 1280, 1281, 15999,
                16000, 16001, 16159, 16160, 16161, 31999, 32000, 32001, 159_999, 160_000, 160_001, 479_999, 480_000,
                480_001, 480_160, 480_161, 4_799_999, 4_800_000, 4_800_001, 5_000_000})
#: The lengths run through a real feature extractor (about 0.1 s each where it pads to 30 s).
FEATURED = [1, 160, 161, 320, 321, 481, 640, 641, 16000, 16001, 16160, 16161, 479_999, 480_000, 480_001, 480_161]


def _processor(cls, **attrs):
    proc = object.__new__(cls)  # the audio half only: no tokenizer, no chat template
    for key, value in attrs.items():
        setattr(proc, key, value)
    return proc


def _silence(n: int) -> np.ndarray:
    return np.zeros(n, np.float32)


@pytest.fixture(scope="module")
def qwen2_audio():
    return _processor(Qwen2AudioProcessor, feature_extractor=WhisperFeatureExtractor(), audio_token="<|AUDIO|>")


def test_qwen2_audio_against_its_processor(qwen2_audio):
    inputs, texts = qwen2_audio._process_audio([_silence(n) for n in FEATURED], sampling_rate=16000,
                                               **Qwen2AudioProcessor.audio_kwargs)
    assert list(inputs["feature_attention_mask"].sum(-1)) == [qwen2_audio_frames(n) for n in FEATURED]
    assert list(inputs["num_audio_tokens"]) == [qwen2_audio_tokens(n) for n in FEATURED]
    assert [t.count("<|AUDIO|>") for t in texts] == [qwen2_audio_tokens(n) for n in FEATURED]
    assert qwen2_audio_tokens(480_161) == qwen2_audio_tokens(10**7) == 750  # cut at 30 s


def test_qwen2_5_omni_against_its_processor_and_model():
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300)  # the checkpoint's 300 s window
    proc = _processor(Qwen2_5OmniProcessor, feature_extractor=extractor, audio_token="<|AUDIO|>")
    assert [proc._get_num_audio_tokens(n) for n in EDGES] == [qwen2_5_omni_tokens(n) for n in EDGES]
    encoder_lengths = Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths
    frames = np.array([qwen2_5_omni_frames(n) for n in EDGES])
    assert list(encoder_lengths(None, frames)[1]) == [qwen2_5_omni_tokens(n) for n in EDGES]
    inputs, _ = proc._process_audio([_silence(4_800_161)], **Qwen2_5OmniProcessor.audio_kwargs)  # past 300 s
    assert inputs["feature_attention_mask"].sum() == qwen2_5_omni_frames(4_800_161) == 30_000
    assert inputs["num_audio_tokens"][0] == qwen2_5_omni_tokens(4_800_161) == 7500


def test_qwen3_omni_against_its_processor_and_model():
    proc = _processor(Qwen3OmniMoeProcessor, feature_extractor=WhisperFeatureExtractor(feature_size=128),
                      audio_token="<|audio_pad|>")
    assert [proc._get_num_audio_tokens(n) for n in EDGES] == [qwen3_omni_tokens(n) for n in EDGES]
    assert [int(qwen3_model_lengths(n // 160)) for n in EDGES] == [qwen3_omni_tokens(n) for n in EDGES]
    for n in [*(n for n in FEATURED if n > 200), 640_017]:  # each alone: in a batch the padding moves the count
        inputs, _ = proc._process_audio([_silence(n)], **Qwen3OmniMoeProcessor.audio_kwargs)
        assert inputs["feature_attention_mask"].sum() == qwen3_omni_frames(n), n
        assert inputs["num_audio_tokens"][0] == qwen3_omni_tokens(n), n
    assert qwen3_omni_tokens(640_017) == 13 * 40 > qwen3_omni_tokens(480_000) == 13 * 30  # no cut at 30 s
    # in a batch, an audio shorter than the longest keeps ceil(n/160) frames: 16001 gives 14, not 13
    inputs, _ = proc._process_audio([_silence(16001), _silence(32001)], **Qwen3OmniMoeProcessor.audio_kwargs)
    assert list(inputs["num_audio_tokens"]) == [14, 26] and qwen3_omni_tokens(16001) == 13
    with pytest.raises(RuntimeError, match="Padding size"):  # its STFT cannot take 200 samples or fewer
        proc._process_audio([_silence(AUDIO_RULES["qwen3_omni_moe"].min_samples - 1)],
                            **Qwen3OmniMoeProcessor.audio_kwargs)


def test_gemma4_against_its_processor():
    proc = _processor(Gemma4Processor, feature_extractor=Gemma4AudioFeatureExtractor(), audio_seq_length=750,
                      audio_token="<audio_soft_token>", boa_token="<start_of_audio>", eoa_token="<end_of_audio>")
    assert [proc._compute_audio_num_tokens(_silence(n), 16000) for n in EDGES] == [gemma4_audio_tokens(n)
                                                                                   for n in EDGES]
    for n in [*FEATURED, 2]:
        features = proc.feature_extractor([_silence(n)], sampling_rate=16000, return_tensors="np")
        assert features["input_features_mask"].sum() == gemma4_audio_frames(n), n
        assert proc.replace_audio_token(features, 0).count("<audio_soft_token>") == gemma4_audio_tokens(n), n
    assert gemma4_audio_tokens(10**7) == 750


def test_the_rules_table_names_each_family_s_arithmetic_and_cut():
    assert set(AUDIO_RULES) == {"qwen2_audio", "qwen2_5_omni", "qwen3_omni_moe", "gemma4"}
    for family, rule in AUDIO_RULES.items():
        assert rule.family == family and rule.rate == 16000
        assert rule.tokens(rule.min_samples) >= 1, family
        assert rule.tokens(0) == 0 and rule.kept(100) == 100
        if rule.max_samples is not None:  # past the cut nothing changes: the processor reads kept(n) samples
            assert rule.kept(rule.max_samples + 999) == rule.max_samples
            assert rule.tokens(rule.max_samples + 999) == rule.tokens(rule.max_samples), family
            assert rule.frames(rule.max_samples + 999) == rule.frames(rule.max_samples), family
    for family in ("qwen2_audio", "qwen2_5_omni", "gemma4"):  # below min_samples: no token at all
        assert AUDIO_RULES[family].tokens(AUDIO_RULES[family].min_samples - 1) == 0
    assert AUDIO_RULES["qwen3_omni_moe"].kept(10**9) == 10**9
    with pytest.raises(ValueError, match="0 or more samples"):
        qwen2_audio_tokens(-1)
