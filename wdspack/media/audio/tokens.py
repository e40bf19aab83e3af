"""How many placeholder tokens one audio of ``n`` samples at 16 kHz takes in each family, exactly as the
transformers processors count them (checked against them in ``tests/media/audio/test_tokens.py``).

| family             | feature frames L (the mask's)        | tokens                                   | cut at |
|--------------------|--------------------------------------|------------------------------------------|--------|
| ``qwen2_audio``    | ``min(ceil(n/160), 3000)``           | ``((L-1)//2 + 1 - 2)//2 + 1``            | 30 s   |
| ``qwen2_5_omni``   | ``min(ceil(n/160), 30000)``          | the same                                 | 300 s  |
| ``qwen3_omni_moe`` | ``n//160``                           | ``13·(L//100) + g(L%100)``, ``g(0) = 0`` | never  |
| ``gemma4``         | ``(min(n, 480000) - 161)//160 + 1``  | ``ceil(ceil(L/2)/2)`` (at most 750)      | 30 s   |

A planner keeps ``rule.kept(n)`` samples (what the processor reads) and gives ``rule.tokens(n)`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AUDIO_RULES", "AUDIO_TOKEN_RATE", "AudioRule", "gemma4_audio_frames", "gemma4_audio_tokens",
           "qwen2_5_omni_frames", "qwen2_5_omni_tokens", "qwen2_audio_frames", "qwen2_audio_tokens",
           "qwen3_omni_frames", "qwen3_omni_tokens"]

#: The sample rate every family here takes (Hz).
AUDIO_TOKEN_RATE = 16_000
#: Whisper's hop (10 ms at 16 kHz), Gemma 4's too: one feature frame per hop.
_HOP = 160
#: Gemma 4's mel frame: 20 ms (320 samples) plus one, read with the frame's half before it as left padding.
_GEMMA4_FRAME = 320


def _whisper_padded_frames(n: int, max_samples: int) -> int:
    """A Whisper feature extractor's mask with ``padding="max_length"`` (truncating at ``max_samples``)."""
    return -(-min(n, max_samples) // _HOP)


def _qwen_conv_tokens(frames: int) -> int:
    """The Qwen audio encoder's two convolutions, then its pooling by 2 (``_get_feat_extract_output_lengths``)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def qwen2_audio_frames(n: int, *, max_samples: int = 480_000) -> int:
    """Qwen2-Audio's feature frames: its processor pads to the Whisper window (30 s) and cuts there.

    Example:
        >>> qwen2_audio_frames(16001), qwen2_audio_frames(10**7)
        (101, 3000)
    """
    return _whisper_padded_frames(_samples(n), max_samples)


def qwen2_audio_tokens(n: int, *, max_samples: int = 480_000) -> int:
    """Qwen2-Audio's ``<|AUDIO|>`` tokens for ``n`` samples (at most 750: 25 a second for 30 s).

    Example:
        >>> qwen2_audio_tokens(16000), qwen2_audio_tokens(16001), qwen2_audio_tokens(480001)
        (25, 25, 750)
    """
    return _qwen_conv_tokens(qwen2_audio_frames(n, max_samples=max_samples))


def qwen2_5_omni_frames(n: int, *, max_samples: int = 4_800_000) -> int:
    """Qwen2.5-Omni's feature frames: the same Whisper padding, to its checkpoint's 300 s window
    (``chunk_length`` 300 in its ``preprocessor_config.json``; pass that file's ``n_samples`` where it differs).

    Example:
        >>> qwen2_5_omni_frames(16001), qwen2_5_omni_frames(10**8)
        (101, 30000)
    """
    return _whisper_padded_frames(_samples(n), max_samples)


def qwen2_5_omni_tokens(n: int, *, max_samples: int = 4_800_000) -> int:
    """Qwen2.5-Omni's audio tokens for ``n`` samples (25 a second, at most 7,500).

    Example:
        >>> qwen2_5_omni_tokens(16001), qwen2_5_omni_tokens(4_800_001)
        (25, 7500)
    """
    return _qwen_conv_tokens(qwen2_5_omni_frames(n, max_samples=max_samples))


def qwen3_omni_frames(n: int) -> int:
    """Qwen3-Omni's feature frames of an audio alone: its processor pads to the longest without cutting, so alone
    it has ``n // 160`` (STFT frames less the last). Beside a longer audio in one call (padded to ``N`` samples) it
    has ``min(ceil(n / 160), N // 160)``: the Qwen3-Omni family counts a chat's audio together
    (``wdspack.models.families.qwen3_omni``).

    Example:
        >>> qwen3_omni_frames(16001)
        100
    """
    return _samples(n) // _HOP


def qwen3_omni_tokens(n: int, *, n_window: int = 50) -> int:
    """Qwen3-Omni's audio tokens for ``n`` samples: 13 for each full window of ``2·n_window`` frames (1 s), then
    the rest through three halvings (``_get_feat_extract_output_lengths``); no cap.

    Example:
        >>> qwen3_omni_tokens(16000), qwen3_omni_tokens(16001), qwen3_omni_tokens(16160)
        (13, 13, 14)
    """
    frames = qwen3_omni_frames(n)
    window = 2 * n_window
    rest = (frames % window - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // window) * 13


def gemma4_audio_frames(n: int, *, max_samples: int = 480_000) -> int:
    """Gemma 4's valid mel frames (its feature extractor's mask): a frame counts when its last sample is audio;
    the extractor cuts at ``max_samples`` (30 s).

    Example:
        >>> gemma4_audio_frames(160), gemma4_audio_frames(161), gemma4_audio_frames(16001)
        (0, 1, 100)
    """
    padded = min(_samples(n), max_samples) + _GEMMA4_FRAME // 2  # semicausal: half a frame of zeros before
    return max(0, (padded - (_GEMMA4_FRAME + 1)) // _HOP + 1)


def gemma4_audio_tokens(n: int, *, max_samples: int = 480_000, max_tokens: int = 750) -> int:
    """Gemma 4's audio soft tokens for ``n`` samples: the valid frames through two stride-2 convolutions, at
    most ``max_tokens`` (the processor's ``audio_seq_length``; 40 ms a token).

    Example:
        >>> gemma4_audio_tokens(16001), gemma4_audio_tokens(10**7)
        (25, 750)
    """
    t = gemma4_audio_frames(n, max_samples=max_samples)
    for _ in range(2):
        t = (t - 1) // 2 + 1 if t > 0 else 0
    return min(t, max_tokens)


@dataclass(frozen=True, slots=True)
class AudioRule:
    """One family's audio arithmetic: ``frames(n)`` (the feature frames its mask counts), ``tokens(n)``, the
    samples past which its processor cuts (``max_samples``; None: it never cuts), and the fewest samples that
    give a token and that its processor takes (``min_samples``), all at ``rate``.

    Example:
        >>> AUDIO_RULES["qwen2_audio"].kept(10**6), AUDIO_RULES["qwen3_omni_moe"].kept(10**6)
        (480000, 1000000)
    """

    family: str
    frames: Callable[[int], int]
    tokens: Callable[[int], int]
    max_samples: int | None
    min_samples: int
    rate: int = AUDIO_TOKEN_RATE

    def kept(self, n: int) -> int:
        """The samples of ``n`` the processor reads (all of them where it does not cut)."""
        return n if self.max_samples is None else min(n, self.max_samples)


#: Each family's rule, by its transformers ``model_type``.
AUDIO_RULES: dict[str, AudioRule] = {
    "qwen2_audio": AudioRule("qwen2_audio", qwen2_audio_frames, qwen2_audio_tokens, max_samples=480_000,
                             min_samples=321),
    "qwen2_5_omni": AudioRule("qwen2_5_omni", qwen2_5_omni_frames, qwen2_5_omni_tokens, max_samples=4_800_000,
                              min_samples=321),
    # its processor's STFT (torch, reflect padding of 200) raises on 200 samples or fewer
    "qwen3_omni_moe": AudioRule("qwen3_omni_moe", qwen3_omni_frames, qwen3_omni_tokens, max_samples=None,
                                min_samples=201),
    "gemma4": AudioRule("gemma4", gemma4_audio_frames, gemma4_audio_tokens, max_samples=480_000, min_samples=161),
}


def _samples(n: int) -> int:
    if n < 0:
        raise ValueError(f"an audio has 0 or more samples, got {n}")
    return n
