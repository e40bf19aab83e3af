"""The ``wdspack`` command line: each subcommand parses, calls one library function, and maps
wdspack's errors to an exit code and a one-line message.

Exit codes: 0 success, 1 a data or output problem (:class:`~wdspack.errors.WdspackError`),
2 bad arguments (:class:`~wdspack.errors.ConfigError` or argparse).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ._version import __version__
from .errors import ConfigError, WdspackError

__all__ = ["main", "parse_size"]

_EPILOG = """\
examples:
  wdspack pack data/llava.jsonl --output packed/ --tokenizer ./pixtral-tokenizer \\
      --chat-template examples/chat_templates/pixtral.jinja --image-token '[IMG]' \\
      --seq-len 4096 --max-images 16 --tokens-per-image 64 --workers 4

run `wdspack COMMAND --help` for the options of each command.
"""

_PACK_EPILOG = """\
examples:
  # LLaVA JSONL with images next to it, a fixed 64 tokens per image (nanoVLM-style models):
  wdspack pack llava.jsonl --output packed/ --tokenizer ./tok --chat-template tmpl.jinja \\
      --image-token '<image>' --seq-len 4096 --max-images 16 --tokens-per-image 64

  # Parquet with image bytes, laid out exactly as Qwen2.5-VL's own processor does, 4 processes:
  wdspack pack 'data/*.parquet' --output packed/ --processor Qwen/Qwen2.5-VL-3B-Instruct \\
      --seq-len 8192 --max-images 16 --workers 4

  # The job was killed: run the same command again with --resume.

  # img2dataset WebDataset shards (image + .txt/.json caption), a prompt before each caption:
  wdspack pack 'laion/{00000..00099}.tar' --output packed/ --tokenizer ./tok --image-token '[IMG]' \\
      --tokens-per-image 64 --eos-token '</s>' --caption-template '{image}A photo of {caption}' \\
      --seq-len 4096 --max-images 16

  # OBELICS-style documents (texts + images lists) and plain-text rows, long ones cut into pieces:
  wdspack pack 'obelics/*.parquet' 'fineweb/*.parquet' --output packed/ --tokenizer ./tok \\
      --image-token '[IMG]' --tokens-per-image 64 --eos-token '</s>' --seq-len 8192 --max-images 16 \\
      --split-long-documents

  # On a running Ray cluster (`ray start --head` on one node, `ray start --address HEAD:6379` on
  # the others; inputs and --output on storage every node mounts, wdspack installed everywhere):
  wdspack pack /shared/llava.jsonl --output /shared/packed/ --tokenizer ./tok --tokens-per-image 64 \\
      --seq-len 4096 --executor ray --ray-address auto

  # Inputs and output on object storage (pip install s3fs; credentials from the AWS environment):
  wdspack pack 's3://bucket/llava/*.jsonl' --output s3://bucket/packed/ --tokenizer ./tok \\
      --tokens-per-image 64 --seq-len 4096

  # Not on a terminal (Slurm, nohup, CI), progress is a line on stderr every 30 s; change it with
  # WDSPACK_PROGRESS_INTERVAL=SECONDS, or pass --quiet for none.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line that names the option meant (``--seq_len``: ``--seq-len``)."""

    words: Sequence[str] = ()  # the command line being parsed (main sets it)

    def error(self, message: str) -> NoReturn:
        target = _command_parser(self, self.words)
        hints = [_option_hint(word, target) for word in self.words if word.startswith("--")]
        hint = "".join(f"; {h}" for h in hints if h)
        self.exit(2, f"{target.prog}: error: {message}{hint} (`{target.prog} --help` lists the options)\n")


def _command_parser(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser:
    """The subcommand's parser named in ``words`` (``parser`` itself when it has none)."""
    for action in parser._actions:  # argparse keeps its actions nowhere public (stable since Python 3.2)
        if isinstance(action, argparse._SubParsersAction):
            return next((action.choices[w] for w in words if w in action.choices), parser)
    return parser


def _option_hint(word: str, parser: argparse.ArgumentParser) -> str | None:
    """``--seq_len is not an option: did you mean --seq-len?`` for a word ``parser`` does not know."""
    import difflib

    name = word.split("=", 1)[0]
    known = sorted(o for action in parser._actions for o in action.option_strings)
    if name in known or name == "--":
        return None
    close = difflib.get_close_matches(name.replace("_", "-").lower(), known, n=1, cutoff=0.75)
    return f"{name} is not an option" + (f": did you mean {close[0]}?" if close else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (tests call this in-process)."""
    parser = _parser()
    _Parser.words = tuple(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help and on usage errors
        return int(e.code or 0)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        code = args.run(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, not as a traceback at exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away
    except ConfigError as e:
        print(f"wdspack {args.command}: error: {e}", file=sys.stderr)
        return 2
    except WdspackError as e:
        print(f"wdspack {args.command}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a file-size limit, a read-only folder: one line, not a traceback
        print(f"wdspack {args.command}: error: {_os_error_text(e, getattr(args, 'output', None))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"wdspack {args.command}: interrupted; re-run with --resume to continue", file=sys.stderr)
        return 130


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not raise again
    (the way the Python docs handle SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file (tests)
        pass


def _os_error_text(e: OSError, output: str | None) -> str:
    """``cannot write OUT: File too large [Errno 27]; free space ..., then run the same command with --resume``."""
    import errno

    if e.errno == errno.ENOENT:
        return f"{e.filename or 'a file'}: no such file or folder; check the path"
    what = f"cannot write {e.filename or output}" if output else f"cannot read or write {e.filename or 'a file'}"
    full = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    fix = ("free some space (or lift the file-size limit)" if full
           else "check that the folder exists and is writable")
    resume = ", then run the same command with --resume (finished work is kept)" if output else ""
    return f"{what}: {e.strerror or e} [Errno {e.errno}]; {fix}{resume}"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="wdspack", description="Pack multimodal chat data into knapsack-packed WebDataset shards.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"wdspack {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_pack(sub)
    _add_inspect(sub)
    _add_show(sub)
    _add_verify(sub)
    _add_index(sub)
    _add_reshard(sub)
    _add_upload(sub)
    return p


_QUIET_HELP = ("no progress (default: bars on a terminal; elsewhere a line on stderr every 30 s, "
               "WDSPACK_PROGRESS_INTERVAL=SECONDS to change it)")


def _add_pack(sub) -> None:
    p = sub.add_parser("pack", help="tokenize, plan and write packed shards",
                       description="Tokenize chat data once, plan packs under a token and an image budget, "
                                   "and write WebDataset shards with a manifest.",
                       epilog=_PACK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="JSON/JSONL (LLaVA or messages), Parquet, a save_to_disk folder; files, folders or globs; "
                        "local or fsspec URLs (s3://..., hf://datasets/ORG/NAME@REV/...). SOURCE::ROOT gives a "
                        "source its own image root (a.jsonl::imgs/a b.jsonl::imgs/b). A meta file stands for the "
                        "datasets it lists, each with its own root: an InternVL meta JSON, LLaMA-Factory's "
                        "dataset_info.json (pick entries with dataset_info.json#NAME,NAME), a LLaVA-NeXT data "
                        "YAML. An id found in two sources is packed as SOURCE_NAME/ID")
    p.add_argument("--output", "-o", required=True, help="dataset folder to create (a path or an fsspec URL)")
    p.add_argument("--tokenizer", help="tokenizer name or local path (loaded with AutoTokenizer)")
    p.add_argument("--processor", metavar="NAME_OR_PATH",
                   help="the model's processor (a folder or a cached model name) instead of --tokenizer: its "
                        "tokenizer, chat template and image layout, token for token as the processor gives them "
                        "(Qwen2-VL/2.5-VL/3-VL, SmolVLM/Idefics3, Gemma 3, LLaVA, LLaVA-OneVision, Mistral 3)")
    p.add_argument("--chat-template", metavar="FILE", help="Jinja chat template, when the tokenizer has none")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per pack")
    p.add_argument("--max-images", "--max-media", type=int, default=None, dest="max_images",
                   help="media items per pack: images, videos and audio counted together (default: unlimited)")
    p.add_argument("--tokens-per-image", default=None, metavar="N|processor:NAME",
                   help="with --tokenizer, for data with images: the tokens one image takes in the model, a fixed "
                        "count (64 for nanoVLM, 576 for LLaVA-1.5), or processor:NAME_OR_PATH for a "
                        "dynamic-resolution image processor's count (text-only data needs none)")
    p.add_argument("--image-token", help="the tokenizer's image token placeholders expand to, e.g. '<image>'")
    p.add_argument("--image-root", "--media-root", dest="image_root",
                   help="folder (or URL) media paths (images, videos, audio) are relative to, for the sources without "
                        "their own (SOURCE::ROOT or a meta file's); default: each source's folder")
    p.add_argument("--max-image-side", type=int, help="downscale larger images to this longest side at pack time")
    # ---- videos (with --processor of a family that has a video path): wdspack.media.video.plan
    p.add_argument("--video-fps", type=float, metavar="FPS",
                   help="sample video frames at this rate (default: the processor's video settings)")
    p.add_argument("--video-num-frames", type=int, metavar="N",
                   help="sample N frames of each video (instead of --video-fps)")
    p.add_argument("--video-max-frames", type=int, metavar="N", help="at most N frames of one video")
    p.add_argument("--video-max-pixels", type=int, metavar="N", help="resize each video frame to at most N pixels")
    # ---- captions (WebDataset shards) and documents (texts + images, or text): wdspack.packer.text
    p.add_argument("--caption-template", metavar="TEXT",
                   help="layout of image + caption samples, with {image} and {caption} once each, e.g. "
                        "'{image}A photo of {caption}' (default '{image}{caption}': the image tokens, then the "
                        "caption); only the caption and end-of-text are targets")
    p.add_argument("--split-long-documents", action="store_true",
                   help="cut documents longer than --seq-len (or with more than --max-images images) at text "
                        "boundaries into pieces ID#0, ID#1, ...; without it such a document is dropped as too_long")
    p.add_argument("--bos-token", metavar="TOKEN",
                   help="token each caption or document starts with (default: the tokenizer's bos_token, if any)")
    p.add_argument("--eos-token", metavar="TOKEN",
                   help="end-of-text token of captions and documents, a target (default: the tokenizer's eos_token)")
    p.add_argument("--algorithm", default="bfd", help="greedy | shuffle | ffd | bfd | balanced (default bfd)")
    p.add_argument("--shard-size", default="512MB", help="roll over shards at this size (default 512MB)")
    p.add_argument("--shard-packs", type=int, help="roll over shards at this many packs")
    p.add_argument("--cp", type=int, metavar="N",
                   help="plan for N context-parallel ranks: each sample counts its tokens padded to a multiple of "
                        "2·N (TransformerEngine's split), the manifest records N, and the loader inserts that "
                        "padding so every segment splits evenly (--seq-len must divide by 2·N; default: none)")
    p.add_argument("--plan-groups", type=_plan_groups, metavar="N|off",
                   help="plan groups of N partitions in tasks, each writing its own shards: the driver holds no "
                        "per-sample state; off: one global plan (default: groups of ~200 k records for jobs of "
                        "more than 10 M records, WDSPACK_PLAN_GROUPS_ABOVE=RECORDS to change it, else one plan)")
    p.add_argument("--workers", type=int, default=1, help="processes for tokenizing and writing (default 1)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="run tokenizing and writing here (local, default: --workers processes) or as Ray "
                        "tasks (ray: needs pip install wdspack[ray]; the cluster's CPUs replace --workers)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --executor ray, the cluster to join: auto, HOST:6379 or ray://HOST:10001 "
                        "(default: $RAY_ADDRESS, else a new local cluster)")
    p.add_argument("--seed", type=int, default=0, help="seed for shuffles (default 0)")
    p.add_argument("--on-error", choices=("skip", "raise"), default="skip",
                   help="drop bad samples with a reason (skip, default) or stop at the first (raise)")
    p.add_argument("--max-drop-fraction", type=float, metavar="F",
                   help="fail (exit 1, after writing dropped.jsonl, before writing shards) when more than this "
                        "fraction of the samples read is dropped (default 0.05; 1 accepts any); a job that packs "
                        "nothing always fails. After such a failure, --resume with a higher value keeps the "
                        "tokenized samples")
    p.add_argument("--split", default="train", help="shard name prefix (default train)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted job in --output")
    p.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)
    p.set_defaults(run=_run_pack)


def _plan_groups(text: str) -> int:
    """``--plan-groups``: partitions per group, ``off`` (or 0) for one global plan."""
    if text.strip().lower() in ("off", "0"):
        return 0
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of partitions; give N >= 1, or off for one "
                                         "global plan")
    return int(text)


def _run_pack(args: argparse.Namespace) -> int:
    from .packer.config import PackConfig, RunOptions
    from .packer.job import pack_dataset
    from .packer.loading import check_template_syntax
    from .packer.samples import SampleConfig

    template = None
    if args.chat_template:
        path = Path(args.chat_template)
        if not path.is_file():
            raise ConfigError(f"--chat-template {args.chat_template!r} is not a file")
        template = path.read_text(encoding="utf-8")
        check_template_syntax(template, f"--chat-template {args.chat_template!r}")
    sample_config = SampleConfig(tokenizer=args.tokenizer, chat_template=template,
                                 tokens_per_image=args.tokens_per_image,
                                 image_token=args.image_token, max_image_side=args.max_image_side,
                                 processor=args.processor, pretrain=_pretrain_config(args), video=_video_settings(args))
    from .models.locate import locate_model

    for flag, name in (("--tokenizer", args.tokenizer), ("--processor", args.processor)):
        if name:  # before anything loads or the output is touched: a typo or no network answered in a second
            locate_model(name, flag=flag)
    run = RunOptions(workers=args.workers, executor=args.executor, ray_address=args.ray_address,
                     max_drop_fraction=_drop_fraction(args))
    config = PackConfig(seq_len=args.seq_len, max_images=args.max_images, algorithm=args.algorithm,
                        seed=args.seed, shard_max_bytes=parse_size(args.shard_size),
                        shard_max_packs=args.shard_packs, on_error=args.on_error, split=args.split,
                        plan_group_partitions=args.plan_groups, cp=args.cp, run=run)
    summary = pack_dataset(args.sources, args.output, sample_config=sample_config, config=config,
                   image_root=args.image_root, resume=args.resume, progress=not args.quiet)
    for line in summary.lines():
        print(line)
    return 0


def _video_settings(args: argparse.Namespace) -> Any:
    """``--video-fps/--video-max-frames/--video-max-pixels`` as :class:`~wdspack.media.video.plan.VideoSettings`
    (None when none is given)."""
    from .media.video.plan import VideoSettings

    given = {"fps": args.video_fps, "max_frames": args.video_max_frames, "max_pixels": args.video_max_pixels,
             "num_frames": args.video_num_frames}
    return VideoSettings(**given) if any(v is not None for v in given.values()) else None


def _drop_fraction(args: argparse.Namespace) -> float:
    from .packer.config import DEFAULT_MAX_DROP_FRACTION

    return DEFAULT_MAX_DROP_FRACTION if args.max_drop_fraction is None else args.max_drop_fraction


def _pretrain_config(args: argparse.Namespace):
    """How captions and documents are laid out (chats ignore it)."""
    from .packer.text import PretrainConfig

    return PretrainConfig(caption_template=args.caption_template, bos_token=args.bos_token,
                          eos_token=args.eos_token, split_long_documents=args.split_long_documents)


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="numbers and a picture of a packed dataset or a mixture",
                       description="Fill ratio, packs, samples, images, tokens, drops; with --deep (or "
                                   "--plot) the per-pack distributions and the padding a pad-to-longest "
                                   "loader would waste. For a mixture file: each source's weight, passes, "
                                   "packs, tokens, supervised tokens and images per epoch, and the mix "
                                   "achieved over the first --steps global steps (--plot: over steps).",
                       epilog="examples:\n  wdspack inspect packed/ --plot fill.png\n"
                              "  wdspack inspect packed/ --samples-per-step 256"
                              "   # the matching global batch in packs\n"
                              "  wdspack inspect packed/ --ranks 64   # waiting for the slowest rank, balanced or not\n"
                              "  wdspack inspect hf://datasets/org/name@main --json\n"
                              "  wdspack inspect mix.yaml --ranks 8 --batch-size 2 --plot mix.png"
                              "   # a mixture's epoch and achieved mix",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="dataset folder, https:// or hf://datasets/ORG/NAME[@REV], or a mixture file "
                                   "(.yaml/.json with sources)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--deep", action="store_true", help="read every pack for distributions")
    p.add_argument("--plot", metavar="FILE.png", help="write a picture (implies --deep; needs matplotlib)")
    p.add_argument("--samples-per-step", type=int, metavar="N",
                   help="a per-sample global batch size: print the global batch in packs that matches it "
                        "(N / mean samples per pack)")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="how long the slowest of N ranks makes a step wait, with and without balance='cost' "
                        "(needs the pack index); for a mixture, the ranks of a global step (default 1)")
    mix = p.add_argument_group("mixture", "the layout whose achieved mix is shown (MIXTURE.yaml only)")
    mix.add_argument("--steps", type=int, default=100, metavar="N", help="global steps measured (default 100)")
    mix.add_argument("--batch-size", type=int, default=1, metavar="B", help="packs per rank per step (default 1)")
    mix.add_argument("--workers", type=int, default=1, metavar="K", help="loader workers per rank (default 1)")
    mix.add_argument("--seed", type=int, default=0, help="the loader's seed (default 0)")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    import json

    from .ops.inspect import dataset_stats, format_stats, is_mixture, plot_stats

    if is_mixture(args.dataset):
        from .ops.mixture import mixture_stats

        stats = mixture_stats(args.dataset, steps=args.steps, ranks=args.ranks or 1, workers=args.workers,
                              batch_size=args.batch_size, seed=args.seed)
    else:
        stats = dataset_stats(args.dataset, deep=args.deep or bool(args.plot),
                              samples_per_step=args.samples_per_step, ranks=args.ranks)
    if args.plot:
        plot_stats(stats, args.plot)
    shown = {k: v for k, v in stats.items() if not k.startswith("_")}
    print(json.dumps(shown, indent=1) if args.json else "\n".join(format_stats(shown)))
    if args.plot and not args.json:
        print(f"plot      {args.plot}")
    return 0


def _add_show(sub) -> None:
    p = sub.add_parser("show", help="print packed samples as text, the trained tokens marked",
                       description="Decode packs with the tokenizer the manifest names and print each sample, "
                                   "the trained tokens (labels) marked: in colour on a terminal, else between "
                                   "[[ and ]]; a run of image placeholders is shown as <image×N>.",
                       epilog="examples:\n  wdspack show packed/\n"
                              "  wdspack show packed/ --pack 12 --packs 3 --samples 4 --max-chars 800\n"
                              "  wdspack show hf://datasets/org/name@main --tokenizer ./tok   # a tokenizer "
                              "folder when the recorded one is not here",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="dataset folder, https:// or hf://datasets/ORG/NAME[@REV]")
    p.add_argument("--pack", type=int, default=0, metavar="I", help="the first pack shown, in manifest order "
                                                                    "(default 0)")
    p.add_argument("--packs", type=int, default=1, metavar="N", help="how many packs to show (default 1)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="decode with this tokenizer (default: the one the manifest names, loaded offline)")
    p.add_argument("--samples", type=int, default=0, metavar="N",
                   help="show at most N samples of each pack (default 0: all)")
    p.add_argument("--max-chars", type=int, default=0, metavar="N",
                   help="show at most N characters of each sample, the middle elided (default 0: all)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="mark trained text in colour (auto: on a terminal) or between [[ ]] (default auto)")
    p.set_defaults(run=_run_show)


def _run_show(args: argparse.Namespace) -> int:
    from .ops.show import COLOR, PLAIN, show_lines

    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for line in show_lines(args.dataset, packs=args.packs, pack=args.pack, tokenizer=args.tokenizer,
                           marks=COLOR if color else PLAIN, max_chars=args.max_chars, samples=args.samples):
        print(line)
    return 0


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="prove a packed dataset is intact",
                       description="Check every shard's size and sha256, decode every pack against the "
                                   "format's invariants and budgets, check that each packed video's file holds "
                                   "the data of the frames its plan names (a clip cut short is named with its "
                                   "sample), and with --source prove every source sample is in exactly one pack "
                                   "or in the dropped list.",
                       epilog="examples:\n  wdspack verify packed/\n"
                              "  wdspack verify packed/ --source data/llava.jsonl\n"
                              "  wdspack verify packed/ --source a.jsonl::imgs/a b.jsonl::imgs/b  # as given to pack",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="dataset folder, https:// or hf://datasets/ORG/NAME[@REV]")
    p.add_argument("--source", nargs="+", metavar="SOURCE",
                   help="the original inputs, as given to pack (SOURCE::ROOT and meta files too)")
    p.add_argument("--image-root", "--media-root", dest="image_root", help="as given to pack")
    p.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from .ops.verify import verify_dataset

    problems = verify_dataset(args.dataset, sources=args.source, image_root=args.image_root)
    for line in problems:
        print(f"FAIL {line}")
    if problems:
        print(f"{len(problems)} problem{'s' * (len(problems) != 1)} in {args.dataset}", file=sys.stderr)
        return 1
    print(f"OK {args.dataset}: every shard, pack and sample checks out")
    return 0


def _add_index(sub) -> None:
    p = sub.add_parser("index", help="add the pack index (offsets and costs) to a dataset packed without one",
                       description="Read every shard of a local dataset once and write pack_index.npy (each "
                                   "pack's byte offset, tokens, Σ length², samples, images, image tokens and "
                                   "trained tokens), naming it in manifest.json. The balanced loader "
                                   "(balance='cost') needs it; `wdspack pack` and `reshard` write it themselves.",
                       epilog="example:\n  wdspack index packed/",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="a local dataset folder")
    p.set_defaults(run=_run_index)


def _run_index(args: argparse.Namespace) -> int:
    from .ops.index import index_dataset

    entry = index_dataset(args.dataset)
    print(f"wrote {args.dataset.rstrip('/')}/{entry['file']} ({entry['bytes']} bytes) and named it in manifest.json")
    return 0


def _add_reshard(sub) -> None:
    p = sub.add_parser("reshard", help="re-pack a packed dataset for new budgets, without re-tokenizing",
                       description="Split packs back into their samples (tokens, masks and images untouched) "
                                   "and re-plan them for a new --seq-len / --max-images.",
                       epilog="examples:\n  wdspack reshard packed-2048/ packed-4096/ --seq-len 4096\n"
                              "  wdspack reshard hf://datasets/org/name@main packed-8k/ --seq-len 8192 "
                              "--max-images 32",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="the packed dataset to re-pack: a folder, https:// or hf://datasets/ORG/NAME[@REV]")
    p.add_argument("output", help="dataset folder to create (a path or an fsspec URL)")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per pack in the new dataset")
    p.add_argument("--max-images", "--max-media", type=int, dest="max_images",
                   help="media items per pack in the new dataset, every kind's (default: unlimited)")
    p.add_argument("--algorithm", default="bfd", help="greedy | shuffle | ffd | bfd | balanced (default bfd)")
    p.add_argument("--shard-size", default="512MB", help="roll over shards at this size (default 512MB)")
    p.add_argument("--shard-packs", type=int, help="roll over shards at this many packs")
    p.add_argument("--cp", type=int, metavar="N",
                   help="plan for N context-parallel ranks: each sample counts its tokens padded to a multiple of "
                        "2·N (TransformerEngine's split), the manifest records N, and the loader inserts that "
                        "padding so every segment splits evenly (--seq-len must divide by 2·N; default: none, "
                        "whatever the source was planned for)")
    p.add_argument("--workers", type=int, default=1, help="processes for splitting and writing (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed for shuffles (default 0)")
    p.add_argument("--max-drop-fraction", type=float, metavar="F",
                   help="fail when more than this fraction of the samples is dropped at the new budgets "
                        "(default 0.05; 1 accepts any)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted reshard in OUTPUT")
    p.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)
    p.set_defaults(run=_run_reshard)


def _run_reshard(args: argparse.Namespace) -> int:
    from .packer.config import PackConfig, RunOptions
    from .packer.reshard import reshard_dataset

    config = PackConfig(seq_len=args.seq_len, max_images=args.max_images, algorithm=args.algorithm,
                        seed=args.seed, shard_max_bytes=parse_size(args.shard_size),
                        shard_max_packs=args.shard_packs, cp=args.cp,
                        run=RunOptions(workers=args.workers, max_drop_fraction=_drop_fraction(args)))
    summary = reshard_dataset(args.source, args.output, config=config, resume=args.resume, progress=not args.quiet)
    for line in summary.lines():
        print(line)
    return 0


def _add_upload(sub) -> None:
    p = sub.add_parser("upload", help="publish a packed dataset to the Hugging Face Hub",
                       description="Upload shards, manifest and a dataset card (with the packing statistics "
                                   "and plot). Re-running uploads only what is missing. The token comes from "
                                   "HF_TOKEN or `hf auth login`; prefer those to --token, which puts "
                                   "the secret on the command line.",
                       epilog="examples:\n  HF_TOKEN=... wdspack upload packed/ my-org/llava-packed-4096 --private",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="the local dataset folder to publish")
    p.add_argument("repo_id", metavar="ORG/NAME", help="the Hub dataset repository (created if missing)")
    p.add_argument("--private", action="store_true",
                   help="create the repository as private (an existing one keeps its visibility)")
    p.add_argument("--revision", help="branch to commit to")
    p.add_argument("--token",
                   help="a Hub token; prefer HF_TOKEN (a token on the command line is visible to other users)")
    p.set_defaults(run=_run_upload)


def _run_upload(args: argparse.Namespace) -> int:
    from .ops.upload import upload_dataset

    upload_dataset(args.dataset, args.repo_id, private=args.private, revision=args.revision, token=args.token)
    return 0


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Parse a byte size such as ``512MB``, ``1.5GiB`` or ``100000``.

    Example:
        >>> parse_size("512MB"), parse_size("1KiB")
        (512000000, 1024)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"size {text!r} not understood; write e.g. 512MB, 2GiB or 100000")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


if __name__ == "__main__":
    sys.exit(main())
