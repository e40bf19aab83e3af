"""``wdspack show`` (issue #38 item 10): packed samples as text, trained spans marked, images collapsed.

Run on the demo pack (``demo_packed``, tekken tokenizer) as a user runs it; what it must show is
worked out from the pack itself, decoded with the session's tokenizer.
"""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest

from wdspack.cli import main
from wdspack.format.dataset import iter_dataset_packs, open_dataset
from wdspack.ops.show import COLOR, PLAIN, render_tokens


@pytest.fixture(scope="module")
def first_pack(demo_packed):
    folder, _ = demo_packed
    return next(iter_dataset_packs(*open_dataset(str(folder))))


def _sample(pack, k):
    bounds = [0, *itertools.accumulate(pack.seq_lens)]
    return pack.input_ids[bounds[k]:bounds[k + 1]], pack.loss_mask[bounds[k]:bounds[k + 1]]


@pytest.mark.slow  # loads the tokenizer the manifest names, as a user's run does (tekken: ~5 s)
def test_show_prints_headers_trained_text_marked_and_images_collapsed(demo_packed, first_pack, tekken, capsys):
    folder, _ = demo_packed
    shard, pack = first_pack
    manifest, _ = open_dataset(str(folder))
    image_id = manifest.tokenizer["image_token_id"]
    assert pack.num_images
    k = pack.image_sample[0]  # the sample of the pack's first image
    ids, mask = _sample(pack, k)
    runs = [[t for t, _ in run] for trained, run in itertools.groupby(zip(ids.tolist(), mask.tolist()),
                                                                      key=lambda x: x[1]) if trained]
    assert runs, "the sample has trained tokens"
    owned = [n for n, owner in zip(pack.image_tokens, pack.image_sample) if owner == k]
    assert int(np.sum(ids == image_id)) == sum(owned)

    assert main(["show", str(folder), "--color", "never"]) == 0  # the tokenizer the manifest names, offline
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (f"== pack 0  ({shard}, {pack.num_samples} samples, {pack.num_tokens} of "
                        f"{manifest.seq_len} tokens, {pack.num_images} images)")
    headers = [line for line in lines if line.startswith("-- sample ")]
    assert len(headers) == pack.num_samples and len(lines) == 1 + 2 * pack.num_samples
    assert headers[k].startswith(f"-- sample {k + 1}/{pack.num_samples}  {pack.sample_ids[k]}  "
                                 f"({len(ids)} tokens, {int(mask.sum())} trained, ")
    text = lines[lines.index(headers[k]) + 1]
    for run in runs:  # every trained span of the sample, decoded, between the marks
        assert f"[[{tekken.decode(run)}]]" in text
    assert "".join(f"<image×{n}>" for n in owned) in text and text.count("<image×") == len(owned)
    assert "[IMG][IMG]" not in out
    assert "\x1b[" not in out  # no colour codes when asked for none (or piped)


def test_show_pages_packs_and_samples(demo_packed, capsys):
    folder, _ = demo_packed
    total = sum(s.packs for s in open_dataset(str(folder))[0].shards)
    assert main(["show", str(folder), "--pack", str(total - 2), "--packs", "5", "--samples", "1",
                 "--max-chars", "40"]) == 0  # the last two packs: fewer than asked, in the last shard
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines if line.startswith("==")] == [f"== pack {total - 2}",
                                                                                f"== pack {total - 1}"]
    assert sum(line.startswith("-- sample 1/") for line in lines) == 2
    assert all("more samples; --samples 0 shows them all" in line for line in lines if line.startswith("-- ("))
    texts = [line for line in lines if not line.startswith(("==", "--"))]
    assert all(len(t) < 40 + 40 for t in texts) and any("characters) …" in t for t in texts)


def test_render_tokens_marks(first_pack, tekken):
    _, pack = first_pack
    ids, mask = _sample(pack, 0)
    plain = render_tokens(tekken, ids, mask, image_token_id=10)
    coloured = render_tokens(tekken, ids, mask, image_token_id=10, marks=COLOR)
    assert plain.count(PLAIN[0]) == coloured.count(COLOR[0]) >= 1
    assert coloured.replace(COLOR[0], PLAIN[0]).replace(COLOR[1], PLAIN[1]) == plain
    assert render_tokens(tekken, [10, 10, 10], [0, 0, 0], image_token_id=10) == "<image×3>"
    # adjacent images, one marker each when their counts are given
    assert render_tokens(tekken, [10] * 4, [0] * 4, image_token_id=10, image_tokens=[2, 2]) == "<image×2><image×2>"


def test_a_tokenizer_that_is_not_here_is_one_line_naming_the_fix(demo_packed, tmp_path, capsys):
    folder, _ = demo_packed
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["tokenizer"]["name"] = str(tmp_path / "gone")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    assert main(["show", str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gone" in err and "pass --tokenizer PATH" in err, err
    assert main(["show", str(folder), "--pack", "10000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--pack 10000" in err and "packs (0 to" in err, err


def test_an_elided_sample_keeps_its_trained_runs_marked():
    from wdspack.ops.show import PLAIN, _elide

    text = "user says hello " * 4 + "[[" + "the answer " * 10 + "]]"
    shown = _elide(text, 60, PLAIN)
    head, tail = shown.split(" … ")[0], shown.split(" … ")[-1]
    assert tail.startswith("[[") and tail.endswith("]]") and "[[" not in head
    inside = _elide("[[" + "x" * 100 + "]]", 40, PLAIN)
    assert inside.split(" … ")[0].endswith("]]") and inside.split(" … ")[-1].startswith("[[")
    assert _elide("short", 40, PLAIN) == "short"


def test_render_tokens_takes_each_kinds_ids_by_kind_as_by_its_first_names(tekken):
    ids, mask = [10, 10, 11, 11, 11], [0] * 5
    by_kind = render_tokens(tekken, ids, mask, token_ids={"image": 10, "video": 11},
                            media_tokens={"image": [1, 1], "video": [3]})
    assert by_kind == render_tokens(tekken, ids, mask, image_token_id=10, image_tokens=[1, 1], video_token_id=11,
                                    video_tokens=[3]) == "<image×1><image×1><video×3>"
    with pytest.raises(TypeError, match="unexpected keyword argument 'smell_token_id'"):
        render_tokens(tekken, ids, mask, smell_token_id=12)
