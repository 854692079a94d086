"""`finetune hashee-score`: a HashEE model's score and FLOPs on a split, its ELUE points, and ELUE submission files.

A HashEE model has one operating point per trained map (no threshold to sweep), so where `early-exit` writes a sweep
this writes that point: OUTPUT/hashee_scores.json (the split's metrics, mean FLOPs per sample against the same model
computing every token at every layer, the share of tokens each layer computes, the token map's record) and
OUTPUT/elue_points.json, which `finetune elue-score --points` reads beside other systems' results.

`--submission` adds OUTPUT/submission/, ELUE's files for the test split (`finetune.score.submission.write_submission`:
`{TASK}.tsv` predictions, `{TASK}_exit_layer.tsv` with each sample's FLOPs from our per-token counter) with the
trace in HashEE's form: `(n),emb; (r,n,H),layer_l; ...; (H),exit_L` - layer l ran r of the sample's n tokens
(layers no token reached are left out) - and `model.py` extended by `TokenLayer`, the module ELUE runs for such an
entry (input [B, r, n, H]: one shape that carries both counts). `{TASK}_token_layers.tsv` lists r per layer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from common.hub import resolve_pretrained
from common.io import atomic_write_json, atomic_write_text, make_dirs, removed_on_failure
from common.outputs import RESULTS, Output, check_output
from elasticbert import CheckpointError, ElasticBertHashEEForSequenceClassification

from .config import load_run_config
from .data import load_tokenizer, subsample
from .hashee import SplitScore, elue_points, score_split
from .model import check_max_length, load_finetuned, resolve_device
from .results import check_earlier_result, data_source, result_identity
from .score.evaluation import task_for
from .score.submission import model_definition, write_submission
from .task_check import check_task_fits
from .tasks import MissingSplitError, TaskSpec, load_split, predictions_from_outputs

HASHEE_SCORES = Output(
    "hashee-score", "a HashEE scoring (hashee_scores.json, elue_points.json, submission/)", folder=True, accepts=RESULTS
)


def load_hashee(model_dir: str | Path, device: str) -> tuple[Path, ElasticBertHashEEForSequenceClassification]:
    """A fine-tuned HashEE classifier (RUN/best), refused by name when the directory holds another model."""
    directory = resolve_pretrained(model_dir, what="--model")
    model = load_finetuned(directory, purpose="scoring it")
    if not isinstance(model, ElasticBertHashEEForSequenceClassification):
        raise CheckpointError(
            f"{directory}: not a HashEE model (model_type elasticbert-hashee); score a sentence-level early-exit "
            "model with `finetune early-exit`"
        )
    return directory, model.to(resolve_device(device))


def split_summary(task: TaskSpec, scored: SplitScore, labels: np.ndarray | None) -> dict:
    """The split's metrics (when labelled), FLOPs and where the tokens stopped."""
    layers = scored.running.shape[1]
    summary = {
        "examples": len(scored.lengths),
        "mean_flops": float(scored.flops.mean()),
        "full_model_mean_flops": float(scored.full_flops.mean()),
        "flops_speedup": float(scored.full_flops.mean() / scored.flops.mean()),
        "mean_layers_per_token": scored.token_layers_mean,
        "running_share_per_layer": [float(scored.running[:, i].sum() / scored.lengths.sum()) for i in range(layers)],
    }
    if labels is not None:
        summary["metrics"] = task.compute_metrics(scored.logits, labels)
        summary["score"] = summary["metrics"]["score"]
    return summary


def hashee_score(
    model: str | Path,
    task: str | None,
    data_dir: str | None,
    output: str | Path,
    split: str = "dev",
    max_examples: int | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
    device: str = "auto",
    submission: bool = False,
    overwrite: bool = False,
) -> dict:
    """Everything `finetune hashee-score` does (module docstring); returns what hashee_scores.json holds."""
    check_output(output, HASHEE_SCORES, [("--model", model), ("--data-dir", data_dir)], overwrite)
    directory, classifier = load_hashee(model, device)
    spec = task_for(classifier, task)
    if note := check_task_fits(classifier.config, spec, directory):
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    run_config = directory.parent / "run_config.json"  # the training run's --max-length, else 128
    length = max_length or (load_run_config(run_config).data.max_length if run_config.is_file() else 128)
    check_max_length(classifier, length, directory)
    settings = dict(split=split, data_dir=data_source(data_dir), max_examples=max_examples, max_length=length)
    identity = result_identity(directory, task=spec.name, **settings)
    out = Path(output)
    if not overwrite:
        check_earlier_result(out / "hashee_scores.json", identity, "HashEE scores", "--overwrite to replace them")
    tokenizer = load_tokenizer(directory)
    examples = subsample(load_split(spec, data_dir, split), max_examples)
    scored = score_split(classifier, tokenizer, examples, batch_size, length)
    labels = np.asarray([e.label for e in examples]) if all(e.label is not None for e in examples) else None
    report = {
        "identity": identity,
        "model": str(directory),
        "task": spec.name,
        "token_exit": classifier.config.token_exit,
        split: split_summary(spec, scored, labels),
    }
    with removed_on_failure(out):
        make_dirs(out)
        if "score" in report[split]:
            source = f"finetune hashee-score on {spec.name} {split} ({len(examples)} examples), {directory}"
            info, run = classifier.config.token_exit or {}, directory.parent.name  # RUN/best: the run's name
            name = f"HashEE {info.get('hash', 'top')}/{info.get('buckets', '-')} ({run})"
            points = elue_points(name, source, spec, scored.flops.mean(), report[split]["score"])
            atomic_write_json(out / "elue_points.json", points, indent=1)
        if submission:
            report["submission"] = write_hashee_submission(
                classifier, tokenizer, spec, data_dir, out, batch_size, length
            )
        atomic_write_json(out / "hashee_scores.json", report, indent=1)
    return report


def write_hashee_submission(
    model: ElasticBertHashEEForSequenceClassification,
    tokenizer: object,
    task: TaskSpec,
    data_dir: str | None,
    out: Path,
    batch_size: int,
    max_length: int,
) -> dict | str:
    """ELUE's submission files for the test split in OUT/submission/ (module docstring), or why not (no test file)."""
    try:
        examples = load_split(task, data_dir, "test")
    except MissingSplitError as err:
        return f"skipped: {err}"
    scored = score_split(model, tokenizer, examples, batch_size, max_length)
    top, count = model.config.num_hidden_layers, len(examples)
    directory = out / "submission"
    meta = {"model": str(model.name_or_path), "task": task.name, "split": "test", "method": "hashee"}
    meta.update(test_mean_flops=float(scored.flops.mean()), num_samples=count, token_exit=model.config.token_exit)
    paths = write_submission(
        directory,
        task,
        [e.index for e in examples],
        predictions_from_outputs(task, scored.logits).tolist(),
        [top] * count,
        scored.lengths.tolist(),
        scored.flops.tolist(),
        [[top]] * count,
        meta,
        model.config,
    )
    name = task.submission_name or task.name
    traces = ["index\tmodules\n"] + [
        f"{e.index}\t{token_trace(int(n), r, model.config.hidden_size)}\n"
        for e, n, r in zip(examples, scored.lengths, scored.running)
    ]
    layers = ["index\tlength\trunning_per_layer\n"] + [
        f"{e.index}\t{int(n)}\t{','.join(str(int(x)) for x in r)}\n"
        for e, n, r in zip(examples, scored.lengths, scored.running)
    ]
    atomic_write_text(directory / f"{name}_modules.tsv", "".join(traces))
    atomic_write_text(directory / f"{name}_token_layers.tsv", "".join(layers))
    atomic_write_text(directory / "model.py", model_definition(model.config) + TOKEN_LAYER_SOURCE)
    return {"files": sorted({str(p) for p in paths} | {str(directory / f"{name}_token_layers.tsv")})}


def token_trace(length: int, running: np.ndarray, hidden_size: int) -> str:
    """One sample's activation trace in HashEE's form (module docstring)."""
    parts = [f"({length}),emb"]
    parts += [f"({int(r)},{length},{hidden_size}),layer_{i}" for i, r in enumerate(running, 1) if r]
    parts.append(f"({hidden_size}),exit_{len(running)}")
    return "; ".join(parts)


TOKEN_LAYER_SOURCE = '''

# ------------------------------------------------------------------- HashEE: token-level exit (finetune hashee-score)
# This submission's trace names `(r,n,H),layer_i`: layer i computed r of the sample's n tokens, attending over all n.


class TokenLayer(Layer):
    """`Layer` on r running tokens attending over all n: input [B, r, n, H] (the n tokens' states, once per running
    token: one shape that carries both counts). Keys and values come from x[:, 0] (the n states), queries, the
    attention output, both LayerNorms and the feed-forward block from x[:, :, 0] (the r running tokens)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, running = x[:, 0], x[:, :, 0]
        b, r, h = running.shape
        n, d = states.shape[1], h // self.heads
        q = self.query(running).view(b, r, self.heads, d).transpose(1, 2)
        k = self.key(states).view(b, n, self.heads, d).transpose(1, 2)
        v = self.value(states).view(b, n, self.heads, d).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(b, r, h)
        y = self.norm1(running + self.out(context))
        return self.norm2(y + self.down(nn.functional.gelu(self.up(y))))


_sentence_level_build = build


def build(config: dict | None = None) -> nn.ModuleDict:
    """The modules of a HashEE trace: `emb`, `exit_l`, and `layer_i` as `TokenLayer`s."""
    modules = _sentence_level_build(config)
    c = dict(CONFIG if config is None else config)
    for i in range(1, c["num_hidden_layers"] + 1):
        modules[f"layer_{i}"] = TokenLayer(c)
    return modules
'''
