"""Generate the offline demo dataset: Pillow-drawn images and varied chats, with a few bad records.

    python examples/make_demo_data.py OUT_DIR [--records 1500] [--seed 0]

Writes ``OUT_DIR/llava.jsonl`` (LLaVA / ShareGPT ``conversations``), ``OUT_DIR/messages.jsonl``
(OpenAI / HF ``messages`` with typed parts) and ``OUT_DIR/images/``. Lengths are long-tailed
like real instruction data (most answers short, a lognormal tail, a few long text-only chats);
some chats are multi-turn, some text-only, some multi-image. Deliberately bad records show how
drops are reported: a missing image, corrupt image bytes, a truncated JPEG, an over-long chat, a
malformed JSON line and an unknown role.

Two more files in the layouts public instruction sets ship: ``OUT_DIR/alpaca.json`` (an Alpaca JSON
array: ``instruction``, ``input``, ``output``, some with ``history`` and ``images``) and
``OUT_DIR/tools.jsonl`` (LLaMA-Factory / Glaive tool calling: ShareGPT ``function_call`` and
``observation`` turns, ``tools`` a JSON string), each with one deliberately bad record (an Alpaca
record without ``output``; a ``function_call`` that is not JSON). They come from their own random
stream, so the first two files are the same as before they existed. Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

WORDS = (
    "the a an image shows picture photo scene object color red green blue yellow bright dark small large "
    "left right top bottom center near far person dog cat car tree sky road building window table chart "
    "graph value trend increase decrease because therefore however first second finally answer question "
    "describe explain count how many what where why which is are was were has have this that these those "
    "with without under over between inside outside model data train token pack batch sequence length"
).split()
QUESTIONS = ("Describe the image.", "What color is the largest shape?", "How many shapes are there?",
             "What is written in the picture?", "Explain what you see in detail.", "Compare the two images.")
BAD_KINDS = ("missing_image", "corrupt_image", "truncated_image", "too_long", "malformed_json", "unknown_role")
FORMAT_BAD_KINDS = ("alpaca_without_output", "function_call_not_json")
TASKS = ("Summarize the text.", "Rewrite the sentence in plain words.", "List the key points.",
         "Give a title for the text.", "Explain the idea to a child.", "Translate the text into simple English.")
CITIES = ("Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Perth", "Accra")
#: Function definitions as LLaMA-Factory's and Glaive's tool-calling sets write them.
TOOLS = (
    {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}},
    {"name": "get_local_time", "description": "Get the local time in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "convert_currency", "description": "Convert an amount from one currency to another",
     "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                                     "to": {"type": "string"}},
                    "required": ["amount", "from", "to"]}},
)


def _text(rng: np.random.Generator, n_words: int) -> str:
    words = rng.choice(WORDS, size=max(1, n_words))
    sentences, start = [], 0
    while start < len(words):
        k = int(rng.integers(6, 16))
        chunk = " ".join(words[start:start + k])
        sentences.append(chunk[0].upper() + chunk[1:] + ".")
        start += k
    return " ".join(sentences)


def _answer_words(rng: np.random.Generator) -> int:
    """Long-tailed: median ~80 words, a lognormal tail to a few thousand."""
    return int(min(3000, max(3, rng.lognormal(np.log(80), 1.0))))


def _draw_image(rng: np.random.Generator, idx: int) -> tuple[bytes, str]:
    w, h = (int(v) for v in rng.integers(64, 641, size=2))
    bg = tuple(int(c) for c in rng.integers(0, 256, 3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 6))):
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x1, y1 = x0 + int(rng.integers(8, w // 2 + 9)), y0 + int(rng.integers(8, h // 2 + 9))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=color)
    d.text((4, 4), f"#{idx}", fill=(255, 255, 255))
    buf = io.BytesIO()
    if rng.random() < 0.7:
        img.save(buf, format="JPEG", quality=80)
        return buf.getvalue(), "jpg"
    img.save(buf, format="PNG")
    return buf.getvalue(), "png"


def generate(out: Path, *, records: int = 1500, seed: int = 0) -> dict[str, int]:
    """Write the demo dataset into ``out``; returns counts."""
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    n_images = 0

    def new_image() -> str:
        nonlocal n_images
        data, ext = _draw_image(rng, n_images)
        name = f"images/{n_images:05d}.{ext}"
        (out / name).write_bytes(data)
        n_images += 1
        return name

    llava, messages = [], []
    for i in range(records):
        u = rng.random()
        n_img = 0 if u < 0.2 else (1 if u < 0.85 else int(rng.integers(2, 5)))
        turns = 1 if rng.random() < 0.7 else int(rng.integers(2, 5))
        if rng.random() < 0.03:  # a few long text-only conversations
            n_img, turns = 0, int(rng.integers(4, 9))
        images = [new_image() for _ in range(n_img)]
        pairs = [(str(rng.choice(QUESTIONS)) if t == 0 and n_img else _text(rng, int(rng.integers(5, 40))),
                  _text(rng, _answer_words(rng))) for t in range(turns)]
        system = _text(rng, 12) if rng.random() < 0.15 else None
        if i % 2 == 0:
            conv = ([{"from": "system", "value": system}] if system else [])
            for t, (q, a) in enumerate(pairs):
                prefix = "<image>\n" * n_img if t == 0 else ""
                conv += [{"from": "human", "value": prefix + q}, {"from": "gpt", "value": a}]
            rec = {"id": f"llava-{i:05d}", "conversations": conv}
            if images:
                rec["image"] = images[0] if len(images) == 1 else images
            llava.append(rec)
        else:
            msgs = ([{"role": "system", "content": system}] if system else [])
            for t, (q, a) in enumerate(pairs):
                content = ([{"type": "image"} for _ in range(n_img)] if t == 0 else []) + [{"type": "text", "text": q}]
                msgs += [{"role": "user", "content": content}, {"role": "assistant", "content": a}]
            rec = {"id": f"msg-{i:05d}", "messages": msgs}
            if images:
                rec["images"] = images
            messages.append(rec)

    lines_llava = [json.dumps(r) for r in llava]
    lines_msgs = [json.dumps(r) for r in messages]
    # Deliberately bad records, spread through the files.
    (out / "images" / "corrupt.jpg").write_bytes(rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())
    good_jpeg, _ = _draw_image(np.random.default_rng(seed + 1), 99999)
    while _ != "jpg":
        good_jpeg, _ = _draw_image(np.random.default_rng(seed + len(good_jpeg)), 99999)
    (out / "images" / "truncated.jpg").write_bytes(good_jpeg[: len(good_jpeg) // 2])
    qa = lambda img: [{"from": "human", "value": "<image>\nDescribe the image."},  # noqa: E731
                      {"from": "gpt", "value": "A picture."}]
    bad = [
        json.dumps({"id": "bad-missing-image", "image": "images/does-not-exist.jpg", "conversations": qa(1)}),
        json.dumps({"id": "bad-corrupt-image", "image": "images/corrupt.jpg", "conversations": qa(1)}),
        json.dumps({"id": "bad-truncated-image", "image": "images/truncated.jpg", "conversations": qa(1)}),
        json.dumps({"id": "bad-too-long", "conversations": [
            {"from": "human", "value": "Tell me everything."}, {"from": "gpt", "value": _text(rng, 30000)}]}),
        '{"id": "bad-malformed-json", "conversations": [{"from": "human", "value": "unterminated',
        json.dumps({"id": "bad-unknown-role", "conversations": [
            {"from": "narrator", "value": "Once upon a time."}, {"from": "gpt", "value": "Yes."}]}),
    ]
    for k, line in enumerate(bad):
        target = lines_llava if k % 2 == 0 else lines_msgs
        target.insert(int(rng.integers(0, len(target) + 1)), line)
    (out / "llava.jsonl").write_text("\n".join(lines_llava) + "\n", encoding="utf-8")
    (out / "messages.jsonl").write_text("\n".join(lines_msgs) + "\n", encoding="utf-8")
    formats = generate_formats(out, records=records, seed=seed)
    total_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"records": len(lines_llava) + len(lines_msgs), "images": n_images, "bytes": total_bytes, **formats}


def generate_formats(out: Path, *, records: int, seed: int) -> dict[str, int]:
    """Write ``alpaca.json`` (about ``records / 8`` records) and ``tools.jsonl`` (``records / 10``)."""
    rng = np.random.default_rng([seed, 1])  # its own stream: llava.jsonl and messages.jsonl stay as they were
    alpaca = []
    for k in range(max(2, records // 8)):
        rec = {"instruction": str(rng.choice(TASKS)), "input": _text(rng, int(rng.integers(10, 60)))
               if rng.random() < 0.6 else "", "output": _text(rng, max(3, _answer_words(rng) // 2))}
        if rng.random() < 0.15:
            rec["history"] = [[_text(rng, int(rng.integers(4, 20))), _text(rng, int(rng.integers(10, 80)))]
                              for _ in range(int(rng.integers(1, 3)))]
        if rng.random() < 0.2:
            data, ext = _draw_image(rng, 50000 + k)
            name = f"images/alpaca-{k:05d}.{ext}"
            (out / name).write_bytes(data)
            rec["instruction"] = "<image>\n" + str(rng.choice(QUESTIONS))
            rec["images"] = [name]
        alpaca.append(rec)
    alpaca.insert(int(rng.integers(0, len(alpaca) + 1)), {"instruction": "Summarize the text.",
                                                           "input": "A record without its output."})
    (out / "alpaca.json").write_text(json.dumps(alpaca, indent=1) + "\n", encoding="utf-8")
    tools = [json.dumps(_tool_record(rng)) for _ in range(max(2, records // 10))]
    tools.insert(int(rng.integers(0, len(tools) + 1)), json.dumps({"conversations": [
        {"from": "human", "value": "What is the weather in Paris?"},
        {"from": "function_call", "value": "get_weather(city='Paris')"},  # not JSON
        {"from": "observation", "value": "{\"temperature\": 18}"}, {"from": "gpt", "value": "18 degrees."}],
        "tools": json.dumps(TOOLS[:1])}))
    (out / "tools.jsonl").write_text("\n".join(tools) + "\n", encoding="utf-8")
    return {"alpaca_records": len(alpaca), "tool_records": len(tools)}


def _tool_record(rng: np.random.Generator) -> dict:
    """One user question; the model calls one or two tools, reads the results, answers (or answers
    directly when no tool fits)."""
    city, other = (str(c) for c in rng.choice(CITIES, size=2, replace=False))
    u = rng.random()
    if u < 0.2:  # no tool needed
        conv = [{"from": "human", "value": "Write one sentence about " + city + "."},
                {"from": "gpt", "value": _text(rng, int(rng.integers(8, 30)))}]
    elif u < 0.4:  # two calls at once
        temp = int(rng.integers(-10, 35))
        conv = [{"from": "human", "value": f"What are the weather and the local time in {city}?"},
                {"from": "function_call", "value": json.dumps([
                    {"name": "get_weather", "arguments": {"city": city}},
                    {"name": "get_local_time", "arguments": {"city": city}}])},
                {"from": "observation", "value": json.dumps([{"temperature": temp, "unit": "celsius"},
                                                              {"time": f"{int(rng.integers(0, 24)):02d}:00"}])},
                {"from": "gpt", "value": f"In {city} it is {temp} degrees. " + _text(rng, 12)}]
    elif u < 0.7:
        temp = int(rng.integers(-10, 35))
        conv = [{"from": "human", "value": f"How warm is it in {city} today?"},
                {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": city}})},
                {"from": "observation", "value": json.dumps({"temperature": temp, "unit": "celsius"})},
                {"from": "gpt", "value": f"It is {temp} degrees in {city}."}]
    else:
        amount, rate = int(rng.integers(5, 500)), float(rng.uniform(0.5, 2.0))
        conv = [{"from": "human", "value": f"How much is {amount} EUR in USD? I fly from {city} to {other}."},
                {"from": "function_call", "value": json.dumps({
                    "name": "convert_currency", "arguments": {"amount": amount, "from": "EUR", "to": "USD"}})},
                {"from": "observation", "value": json.dumps({"converted": round(amount * rate, 2)})},
                {"from": "gpt", "value": f"{amount} EUR is {amount * rate:.2f} USD."}]
    return {"conversations": conv, "tools": json.dumps(list(TOOLS))}


def generate_videos(out: Path, *, clips: int = 8, seed: int = 0) -> dict[str, int]:
    """``videos.jsonl`` in LLaMA-Factory's ``mllm_video_demo.json`` layout (``<video>`` + ``videos``) and
    ``videos/*.mp4``: small h264 clips (1.5-4 s of moving shapes, 96×64, 10 fps) made with PyAV."""
    import av

    rng = np.random.default_rng(seed)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    lines, size = [], 0
    for k in range(clips):
        path = out / "videos" / f"clip{k:02d}.mp4"
        frames = int(rng.integers(15, 41))
        color = rng.integers(40, 256, 3)
        with av.open(str(path), "w") as container:
            stream = container.add_stream("h264", rate=10)
            stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
            for f in range(frames):
                pixels = np.full((64, 96, 3), 20, np.uint8)
                x = (f * 3 + 7 * k) % 80
                pixels[16:48, x:x + 16] = color
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        size += path.stat().st_size
        answer = f"A square moves to the right for {frames / 10:.1f} seconds. " + _text(rng, int(rng.integers(5, 30)))
        lines.append(json.dumps({"id": f"video-{k}", "messages": [
            {"role": "user", "content": "<video>What happens in this video?"},
            {"role": "assistant", "content": answer}], "videos": [f"videos/clip{k:02d}.mp4"]}))
    (out / "videos.jsonl").write_text("\n".join(lines) + "\n")
    return {"videos": clips, "bytes": size}


def generate_audio(out: Path, *, clips: int = 8, seed: int = 0) -> dict[str, int]:
    """``audios.jsonl`` in LLaMA-Factory's ``mllm_audio_demo.json`` layout (``<audio>`` + ``audios``) and
    ``audios/*``: short sounds (0.5-3 s of tones and chirps, 8 to 44.1 kHz, mono and stereo) as WAV, FLAC and
    MP3, made with PyAV."""
    from fractions import Fraction

    import av

    rng = np.random.default_rng(seed)
    (out / "audios").mkdir(parents=True, exist_ok=True)
    kinds = (("wav", "pcm_s16le", "s16"), ("flac", "flac", "s16"), ("mp3", "libmp3lame", "fltp"))
    lines, size = [], 0
    for k in range(clips):
        ext, codec, fmt = kinds[k % len(kinds)]
        rate = (8_000, 16_000, 22_050, 44_100)[k % 4]
        seconds = float(rng.uniform(0.5, 3.0))
        t = np.arange(int(rate * seconds)) / rate
        pitch = float(rng.integers(220, 880))
        chirp = k % 2 == 1
        wave = 0.3 * np.sin(2 * np.pi * (pitch + (200 * t if chirp else 0)) * t)
        channels = 1 + k % 2
        signal = np.repeat(wave[None], channels, 0).astype(np.float32)
        layout = "mono" if channels == 1 else "stereo"
        path = out / "audios" / f"sound{k:02d}.{ext}"
        with av.open(str(path), "w") as container:
            stream = container.add_stream(codec, rate=rate, layout=layout)
            frame = av.AudioFrame.from_ndarray(signal, format="fltp", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
            resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate,
                                          frame_size=stream.codec_context.frame_size or 1024)
            for piece in resampler.resample(frame) + resampler.resample(None):
                for packet in stream.encode(piece):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        size += path.stat().st_size
        what = "a rising chirp" if chirp else f"a steady {pitch:.0f} Hz tone"
        answer = f"It is {what}, {seconds:.1f} seconds long. " + _text(rng, int(rng.integers(5, 20)))
        lines.append(json.dumps({"id": f"audio-{k}", "messages": [
            {"role": "user", "content": "<audio>What is that sound?"},
            {"role": "assistant", "content": answer}], "audios": [f"audios/sound{k:02d}.{ext}"]}))
    (out / "audios.jsonl").write_text("\n".join(lines) + "\n")
    return {"audios": clips, "bytes": size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    c = generate(args.out, records=args.records, seed=args.seed)
    print(f"   {c['records']} chat records ({len(BAD_KINDS)} deliberately bad), {c['images']} images, "
          f"{c['bytes'] / 1e6:.1f} MB in {args.out}")
    print(f"   + alpaca.json: {c['alpaca_records']} Alpaca records, tools.jsonl: {c['tool_records']} tool-calling "
          f"chats (1 deliberately bad each)")
    v = generate_videos(args.out, seed=args.seed)
    print(f"   + videos.jsonl: {v['videos']} video chats (LLaMA-Factory's mllm_video_demo layout), "
          f"{v['bytes'] / 1e3:.0f} KB of h264 clips")
    a = generate_audio(args.out, seed=args.seed)
    print(f"   + audios.jsonl: {a['audios']} sound chats (LLaMA-Factory's mllm_audio_demo layout), "
          f"{a['bytes'] / 1e3:.0f} KB of WAV, FLAC and MP3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
