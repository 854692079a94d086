"""The serving commands of `python -m finetune`: `predict` and `save-early-exit` (early-exit classification of
users' texts, `predict.py`) and `export` (a fine-tuned model in another layout: the official one, or ONNX pieces
`onnx_export.py` writes for `onnx_runtime.py`). Early exit's own command, `early-exit`, is `early_exit/cli.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from tqdm.auto import tqdm

from common.cli import add_command, add_device, add_output, add_switch, add_threads, config_argument
from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.io import atomic_path, make_dirs, path_problem, removed_on_failure, write_all
from common.outputs import Output, check_output, first_json_line_has
from common.vocab import DEFAULT_MAX_UNK_FRACTION
from elasticbert import ElasticBertConfig, save_early_exit
from elasticbert.flops import sample_flops
from elasticbert.fnlp_export import export_fnlp
from elasticbert.precision import Precision

from ..model import resolve_device
from ..task_check import check_measured_task
from ..tasks import DataError
from .early_exit.operating_point import chosen_setting, measured_elsewhere, run_precision, split_spec
from .early_exit.rules import PREDICT_STRATEGIES
from .inputs import STDIN, InputFormat, LineParser, TextInput, arriving_batches, read_inputs, resolve_format
from .limits import number_problems, option_name
from .loading import trained_max_length
from .onnx_export import export_onnx
from .onnx_runtime import RUNTIMES
from .predict import EarlyExitClassifier
from .predict_stream import PredictionStream
from .stopping import ReadLines, StopGuard, Stopped
from .verdicts import DEFAULT_MIN_READABLE_SHARE

# -------------------------------------------------------------------------------------- predict, save-early-exit

PREDICT_DESCRIPTION = """\
`python -m finetune predict` (classify texts with early exiting) and `save-early-exit` (store an operating point in
a model's config, for `transformers.pipeline`).

predict reads a file (txt, JSONL or TSV; see `inputs.py`) or stdin and writes one JSON line per input, in input
order: `label`, `probabilities`, `exit_layer`, `flops`, `tokens` (see `predict.py`); an input the model cannot read
(nothing visible, punctuation only, or mostly characters its vocabulary does not know: `verdicts.py`) gets `flag`
and `reason` instead, the summary names such inputs (FILE:LINE), and a run in which no input was readable exits 2.
Both run through one `PredictionStream` (`predict_stream.py`): one queue per layer, every layer call a full batch of
`--batch-size` rows of whatever inputs reached that layer. A file is read and checked whole, then submitted
`CHUNK` inputs at a time (each chunk length-sorted) with a progress bar, and flushed at its end; stdin is streamed:
lines are submitted as they arrive, the engine is flushed whenever no further line is waiting (an interactive user
gets each answer at once, a fast pipe keeps the batches full), and answers are written (and flushed) as soon as they
and every earlier one are ready. `--max-wait S` bounds how long a row waits in a layer queue for its batch to fill.
`--output FILE` is written atomically (nothing is left on an error); it is never a folder, the model or an input, nor
inside one, and it replaces an existing file only with `--overwrite` and only when that file is predictions `predict`
wrote (`common.outputs`).
A summary (inputs/s, exit histogram, mean FLOPs against the full model's) goes to stderr.
"""


PREDICTIONS = Output(
    "predict", "a JSONL file of predictions", own=lambda path: first_json_line_has(path, ("label", "value", "flag"))
)
CHUNK = 4096  # inputs of a file submitted at a time: length-sorted within, memory bounded


@dataclass
class PredictConfig:
    """The `predict` options' defaults (the rule's: `EarlyExitClassifier.from_pretrained`'s; its choices: the rule
    table's, `elasticbert.exit_setting.RULES`). The options only: the setting they name is an `EarlyExitSetting`."""

    input: str = "-"
    format: InputFormat = "auto"
    strategy: str | None = None
    threshold: float | None = None
    operating_point: str | None = None
    patience: int | None = None
    delta: float | None = None
    lte_head: str | None = None
    precision: Precision | None = None
    batch_size: int = 32
    max_length: int | None = None
    max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION
    min_readable_share: float = DEFAULT_MIN_READABLE_SHARE
    progress: bool = True
    overwrite: bool = False
    runtime: str = "torch"
    max_wait: float | None = None


PREDICT_EPILOG = """examples:
  python -m finetune predict --model runs/sst2/best --strategy entropy --threshold 0.2 --input reviews.txt \\
      --output predictions.jsonl
  python -m finetune predict --model runs/sst2/best \\
      --operating-point runs/ee/early_exit_SST-2_dev_bs32.json:fastest-within=1.0 < reviews.txt
  python -m finetune save-early-exit --model runs/sst2/best --operating-point runs/ee/early_exit_SST-2_dev_bs32.json
"""


PREDICT_HELP = "classify texts or pairs from a file or stdin with early exiting: JSONL with label, exit layer, FLOPs"
SAVE_EARLY_EXIT_HELP = (
    "store an early-exit setting in a model's config.json: its forward (and pipelines) then exit early"
)


SAVE_EARLY_EXIT_DESCRIPTION = (
    "Write the rule into MODEL/config.json (`config.early_exit`, atomically; --clear removes it), so "
    "that `transformers.pipeline('text-classification', model=MODEL)` and the model's own forward in eval mode "
    "exit early. The rules a config can carry are those that need no side model (not lte)."
)


def _add_predict(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "predict", predict_main, PREDICT_HELP, description=PREDICT_DESCRIPTION, epilog=PREDICT_EPILOG
    )
    p.add_argument("--model", required=True, help="fine-tuned model directory (RUN/best) or hub name")
    option = partial(config_argument, p, PredictConfig)
    option("input", help="txt, JSONL or TSV file, or - for stdin (streamed)")
    option("format", help="input format (auto: from the file's suffix; stdin: txt)")
    add_output(p, "JSONL file (default: stdout)", required=False)
    option("overwrite", help="replace an existing --output file of predictions (never a folder or another file)")
    _rule_arguments(p)
    option("batch_size", help="rows per layer call: each layer's queue runs when it holds this many (or at a flush)")
    option(
        "max_wait",
        metavar="SECONDS",
        help="the longest a row waits in a layer queue for its batch to fill (default: until it fills, the input "
        "ends or stdin goes quiet)",
    )
    option("max_length", help="tokens per input (default: the operating point's, else the training run's, else 128)")
    option("max_unk_fraction", help="refuse inputs the model's vocabulary turns into more [UNK] than this (1: never)")
    option(
        "min_readable_share",
        help="classify an input only when more than this share of its characters are readable to the model's "
        "vocabulary (else: flag unknown-text; 0: any input with one readable character)",
    )
    add_device(p)
    add_threads(p)
    option(
        "runtime",
        choices=RUNTIMES,
        help="torch: eager PyTorch on --model; onnxruntime: --model is a `finetune export --layout onnx` directory, "
        "the same engine and rules on ONNX Runtime (CPU)",
    )
    option("progress", help="progress bar for files (stderr)")

    p = add_command(
        subparsers,
        "save-early-exit",
        save_main,
        SAVE_EARLY_EXIT_HELP,
        description=SAVE_EARLY_EXIT_DESCRIPTION,
    )
    p.add_argument("--model", required=True, help="a local fine-tuned model directory (RUN/best)")
    _rule_arguments(p, lte=False)
    p.add_argument("--clear", action="store_true", help="remove the setting (every exit runs again)")


def _rule_arguments(p: argparse.ArgumentParser, lte: bool = True) -> None:
    helps = {
        "strategy": "exit rule (static: the full model; default: the model's saved setting, else static)",
        "threshold": "the rule's threshold τ (patience: k exits)",
        "operating_point": "a point of an early-exit sweep: fastest-within=D (default, D=1.0), best, or "
        "STRATEGY=THRESHOLD",
        "patience": "PCEE: consecutive confident exits needed (default: the point's, else 2)",
        "delta": "PABEE on regression: |Δ| below this counts as unchanged (default: the point's, else 0.1)",
        "precision": "inference precision (int8: dynamic quantization, CPU; default: the operating point's or saved "
        "setting's, else fp32)",
        "lte_head": "LTE head file for --strategy lte (default: the operating point's)",
    }
    extra = {"strategy": {"choices": PREDICT_STRATEGIES}, "operating_point": {"metavar": "RESULT.json[:RULE]"}}
    for name, text in helps.items():
        if lte or name != "lte_head":
            config_argument(p, PredictConfig, name, help=text, **extra.get(name, {}))


def predict_inputs(args: argparse.Namespace) -> list[tuple[str, object]]:
    """What `predict` reads, for `check_output`: the model, the input file, the operating point's result, the LTE
    head."""
    point = getattr(args, "operating_point", None)
    point = str(split_spec(point)[0]) if point else None
    return [
        ("--model", args.model),
        ("--input", args.input),
        ("--operating-point", point),
        ("--lte-head", getattr(args, "lte_head", None)),
    ]


def option_problems(args: argparse.Namespace) -> list[str]:
    """The numeric options outside their ranges (`limits`: nan, inf, negative, zero where meaningless), checked
    before anything loads."""
    names = ("batch_size", "max_length", "threads", "max_wait")
    return number_problems({name: getattr(args, name, None) for name in names}, option_name)


class Tally:
    """What the summary needs of every prediction (kept as numbers, not records: stdin may stream for long), and
    which inputs were not classified (their verdicts: `verdicts.py`)."""

    def __init__(self) -> None:
        self.layers: list[int] = []
        self.flops: list[float] = []
        self.tokens: list[int] = []
        self.flagged: dict[str, int] = {}
        self.examples: list[str] = []  # FILE:LINE: reason of the first few unclassified inputs

    def add(self, records: list[dict], inputs: list[TextInput]) -> None:
        for record, item in zip(records, inputs):
            if "flag" in record:
                self.flagged[record["flag"]] = self.flagged.get(record["flag"], 0) + 1
                if len(self.examples) < 3:
                    self.examples.append(f"{item.where}: {record['flag']} ({record['reason']})")
                continue
            self.layers.append(record["exit_layer"])
            self.flops.append(record["flops"])
            self.tokens.append(record["tokens"])

    @property
    def answered(self) -> int:
        """Inputs answered (and written): classified or flagged."""
        return len(self.layers) + sum(self.flagged.values())

    def unclassified(self) -> str:
        """'2 of 5 inputs were not classified (unknown-text 1, no-words 1): FILE:LINE: ...', or ''."""
        count = sum(self.flagged.values())
        if not count:
            return ""
        kinds = ", ".join(f"{flag} {n}" for flag, n in sorted(self.flagged.items()))
        total = count + len(self.layers)
        return f"{count} of {total} inputs were not classified ({kinds}): " + "; ".join(self.examples)

    def hint(self) -> str:
        """What to do when every input was unreadable to the vocabulary: either the text is not in the model's
        language, or the tokenizer is not the model's (the same tell as data_prep's [UNK] guard)."""
        if set(self.flagged) != {"unknown-text"}:
            return ""
        return (
            ". If these texts are in the model's language, its tokenizer does not fit them (another model's "
            "vocabulary, cased vs uncased?); --min-readable-share 0 (with --max-unk-fraction 1) classifies what it "
            "can read"
        )

    def summary(self, seconds: float, classifier: EarlyExitClassifier) -> str:
        """Inputs/s, the exit histogram, mean FLOPs against the full model's (last exit only) on the same inputs."""
        model, n = classifier.model, len(self.layers)
        last = model.exit_layers[-1]
        full = np.mean([sample_flops(model.config, tokens, last).total for tokens in self.tokens])
        mean = float(np.mean(self.flops))
        histogram = {layer: self.layers.count(layer) for layer in model.exit_layers}
        cut = sum(tokens >= classifier.max_length for tokens in self.tokens)
        return (
            f"predict: {n} inputs in {seconds:.2f} s ({n / max(seconds, 1e-9):.1f} inputs/s); exits {histogram}; "
            f"mean FLOPs {mean / 1e9:.4g} G (full model {full / 1e9:.4g} G: x{full / mean:.2f} fewer); "
            f"{cut} inputs reached --max-length {classifier.max_length} (longer ones are cut)"
        )


def predict_main(args: argparse.Namespace) -> int:
    """`python -m finetune predict ...`; a stop signal (SIGTERM, Ctrl-C) ends it in one line (`stopping`)."""
    problems = option_problems(args)
    if problems:
        raise ConfigError(problems)
    if args.input != "-" and (problem := path_problem(args.input)):
        raise ConfigError(f"--input {args.input}: {problem}")
    fmt = resolve_format(args.input, args.format)
    if args.output:
        check_output(args.output, PREDICTIONS, predict_inputs(args), args.overwrite)
    tally, read = Tally(), ReadLines(STDIN if args.input == "-" else args.input, fmt == "tsv")
    try:
        with StopGuard() as guard:
            classifier = _classifier(args)
            seconds = _answer(args, classifier, fmt, read, tally, guard)
    except BrokenPipeError:  # the reader of stdout went away (`| head`): nothing more to say
        sys.stdout = None
        return 0
    except Stopped as stop:
        print(f"predict: {read.stopped(stop, tally.answered, args.output)}", file=sys.stderr, flush=True)
        return stop.exit_code
    if tally.flagged:
        note = "their records carry `flag` and `reason` instead of a label"
        print(f"predict: note: {tally.unclassified()}; {note}", file=sys.stderr)
    print(tally.summary(seconds, classifier), file=sys.stderr)
    return 0


def _classifier(args: argparse.Namespace) -> EarlyExitClassifier:
    """The classifier `predict`'s options name (said on stderr)."""
    device = resolve_device(args.device) if args.runtime == "torch" else torch.device("cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    classifier = EarlyExitClassifier.from_pretrained(
        args.model,
        args.strategy,
        args.threshold,
        patience=args.patience,
        delta=args.delta,
        lte_head=args.lte_head,
        operating_point=args.operating_point,
        max_length=args.max_length,
        batch_size=args.batch_size,
        device=str(device) if args.runtime == "torch" else args.device,
        max_unk_fraction=args.max_unk_fraction,
        precision=args.precision,
        min_readable_share=args.min_readable_share,
        runtime=args.runtime,
        threads=args.threads,
    )
    where = f"{device}" if args.runtime == "torch" else "ONNX Runtime (CPU)"
    print(f"predict: {args.model} on {where}; rule: {classifier.description}", file=sys.stderr, flush=True)
    return classifier


def _answer(
    args: argparse.Namespace, classifier: EarlyExitClassifier, fmt: str, read: ReadLines, tally: Tally, guard: StopGuard
) -> float:
    """Answer every input of the file or stdin into the output (atomically to --output); the seconds it took."""
    columns = classifier.task.text_columns if classifier.task is not None else None
    if args.input != "-":
        read.inputs = read_inputs(args.input, fmt, columns)  # checked whole, before any output
    start, stream = time.perf_counter(), classifier.stream(max_wait=args.max_wait)
    with output_stream(args.output) as out:
        write = partial(_write, out, tally, guard)
        if read.inputs is None:
            read.stream = sys.stdin.buffer
            parser = LineParser(fmt, STDIN, columns, stream=True)
            _serve(stream, arriving_batches(read, parser, args.batch_size), write)
        else:
            inputs = read.inputs
            chunks = ((inputs[i : i + CHUNK], False) for i in range(0, len(inputs), CHUNK))
            bar = tqdm(total=len(inputs), unit="text", desc="predict", disable=not args.progress, file=sys.stderr)
            with bar:
                _serve(stream, chunks, partial(write, progress=bar.update))
        if not tally.layers:  # a file of emoji or of another script: no label is a meaningful answer
            raise DataError(f"no input could be classified: {tally.unclassified()}{tally.hint()}")
    return time.perf_counter() - start


def _serve(
    stream: PredictionStream,
    batches: Iterable[tuple[list[TextInput], bool]],
    write: Callable[[list[tuple[TextInput, dict]]], None],
) -> None:
    """Submit each batch (flushing the engine when the input is `quiet`: nothing more is waiting), write the answers
    that are ready in input order as they come, and everything at the end."""
    for batch, quiet in batches:
        if batch:
            stream.submit(batch)
        if quiet:
            stream.flush()
        write(stream.ready())
    stream.flush()
    write(stream.ready())


def _write(
    out: BinaryIO,
    tally: Tally,
    guard: StopGuard,
    answered: list[tuple[TextInput, dict]],
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write the records' lines, every byte of them (`common.io.write_all`: a short write to a full disk is an error,
    not a lost tail) and flushed (a stream's reader sees each answer at once); a stop signal waits for the end of
    the write (`stopping.StopGuard`), and the tally counts what was written."""
    if not answered:
        return
    inputs, records = zip(*answered)
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with guard.writing():
        write_all(out, lines.encode("utf-8"), getattr(out, "name", None))  # stdout's: `<stdout>`
        tally.add(list(records), list(inputs))
    if progress is not None:
        progress(len(records))


def _stdout() -> BinaryIO:
    """stdout's bytes (under PYTHONUNBUFFERED=1 its unbuffered file, whose write() may write part of what it is
    given: `write_all` writes the rest or raises)."""
    sys.stdout.flush()
    return sys.stdout.buffer


@contextlib.contextmanager
def output_stream(path: str | None) -> Iterator[BinaryIO]:
    """stdout, or `path` written under a temporary name and renamed when everything is in: nothing on an error (nor
    the folders made for it), and a failed write or close names `path` (`common.io.atomic_path`)."""
    if path is None:
        yield _stdout()
        return
    with removed_on_failure(Path(path).parent) as folder:
        make_dirs(folder)
        with atomic_path(path) as tmp, open(tmp, "wb") as handle:
            yield handle


def save_main(args: argparse.Namespace) -> int:
    """`python -m finetune save-early-exit ...`"""
    problems = option_problems(args)
    if problems:
        raise ConfigError(problems)
    if args.clear:
        if args.strategy or args.threshold is not None or args.operating_point:
            raise ConfigError("--clear removes the setting: pass it alone")
        save_early_exit(args.model, None)
        print(f"{args.model}: early-exit setting removed (every exit runs)")
        return 0
    setting, point = chosen_setting(
        args.operating_point, args.strategy, args.threshold, patience=args.patience, delta=args.delta
    )
    if setting is None:
        raise ConfigError("pass --strategy (with --threshold), --operating-point RESULT.json[:RULE], or --clear")
    if point is not None:
        print(f"operating point: {point.describe()}", file=sys.stderr)
    if note := measured_elsewhere(point, args.model, "it is saved into"):  # as `predict` notes it
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    if point is not None and point.task:  # another task's threshold never goes into this model's config
        recorded, note = check_measured_task(ElasticBertConfig.from_pretrained(args.model), point.task, args.model)
        if note:
            print(f"finetune: note: {note}", file=sys.stderr, flush=True)
        setting = replace(setting, task=recorded)
    precision = run_precision(args.precision, point and setting.precision, setting.strategy)
    setting = save_early_exit(args.model, replace(setting, precision=precision))
    print(f"{Path(args.model) / 'config.json'}: early_exit = {json.dumps(setting)}")
    return 0


# -------------------------------------------------------------------------------------------------------- export

EXPORT_DESCRIPTION = """\
`python -m finetune export`: a fine-tuned model (RUN/best, or any model directory we saved) in another checkpoint
layout.

`--layout fnlp`: the released ElasticBERT layout, for the official fine-tuning and inference code (fastnlp/ElasticBERT
on transformers 4.x). A model with one linear exit becomes its static ElasticBertForSequenceClassification
(`classifier`, num_output_layers 1, num_hidden_layers = the exit's layer); one with a linear exit on every layer
from 1 up its dynamic (entropy / patience) one (`classifiers.{i}`, num_output_layers = num_hidden_layers). Other
exit sets and MHA exits are refused, saying why. Weights are written twice, `pytorch_model.bin` (what that code's
transformers reads) and `model.safetensors`; config.json carries the official fields; the tokenizer files are
copied. The directory is written beside OUTPUT and renamed when complete. See `elasticbert.fnlp_export`.

`--layout onnx` (or `--format onnx`): the model as ONNX pieces early exit can stop between — one per layer, its exit
head fused in and the embeddings ahead of the first (fp32 and int8: per-channel weights, one activation scale per
token) — with its tokenizer, its saved early-exit setting
(`save-early-exit` first) and checksums, one directory to copy to a server; `predict --runtime onnxruntime` and
`EarlyExitClassifier.from_pretrained(DIR, runtime="onnxruntime")` serve it with the same engine and rules. Beside the
pieces it writes onnx/early_exit.onnx and onnx/early_exit.int8.onnx: the whole early-exit model in one file each,
the saved rule inside the graph, which any ONNX Runtime serves with no code of ours (Python, Node.js, C++; our own
`predict` uses it at --batch-size 1): docs/onnx_single_file.md. Needs `pip install '.[export]'` (onnx, onnxruntime).
See `finetune.serve.onnx_export` and `finetune.serve.onnx_single`.
"""


EXPORT_EPILOG = """examples:
  python -m finetune export --model runs/sst2/best --output exports/sst2_fnlp --layout fnlp
  python -m finetune save-early-exit --model runs/sst2/best --operating-point runs/ee/early_exit_SST-2_dev_bs32.json
  python -m finetune export --model runs/sst2/best --output exports/sst2_onnx --format onnx
  python -m finetune predict --model exports/sst2_onnx --runtime onnxruntime --input reviews.txt
"""


EXPORT_HELP = (
    "write a fine-tuned model in the official ElasticBERT layout (--layout fnlp) or as ONNX pieces for early exit "
    "on ONNX Runtime (--layout onnx)"
)


def _add_export(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "export", export_main, EXPORT_HELP, description=EXPORT_DESCRIPTION, epilog=EXPORT_EPILOG
    )
    p.add_argument("--model", required=True, help="fine-tuned model directory (RUN/best) or hub name")
    add_output(p, "the directory to write (whole, or nothing on an error)", metavar="DIR")
    p.add_argument(
        "--layout",
        "--format",
        dest="layout",
        choices=("fnlp", "onnx"),
        default="fnlp",
        help="fnlp: the official ElasticBERT code's layout (our own is what train already writes); onnx: ONNX "
        "pieces (embeddings, layers fp32+int8, exits) for `predict --runtime onnxruntime` (default: fnlp)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="onnx: the tokens per input its predictions use (default: the training run's, else 128)",
    )
    add_switch(p, "--overwrite", False, "replace an existing non-empty --output")


def export_main(args: argparse.Namespace) -> int:
    """`python -m finetune export ...`"""
    if args.layout == "onnx":
        directory = resolve_pretrained(args.model, what="--model")
        max_length = args.max_length if args.max_length is not None else trained_max_length(Path(directory))
        manifest = export_onnx(directory, args.output, max_length=max_length, overwrite=args.overwrite)
        steps = manifest["pieces"]["steps"]["fp32"]
        single = manifest["single_file"]
        print(
            f"exported {args.model} -> {args.output} (ONNX: {len(steps)} steps - layer, its exit, the embeddings "
            f"ahead of the first - in fp32 and int8, exits {manifest['exit_layers']}, max_length {max_length}; "
            f"one-file early exit, rule {single['rule']}: {', '.join(single['files'].values())})"
        )
        return 0
    if args.max_length is not None:
        raise ConfigError("--max-length is an option of --layout onnx")
    layout = export_fnlp(args.model, args.output, overwrite=args.overwrite)
    print(f"exported {args.model} -> {args.output} ({layout.describe()})")
    return 0


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Register this package's commands on the `python -m finetune` command line."""
    _add_predict(subparsers)
    _add_export(subparsers)
