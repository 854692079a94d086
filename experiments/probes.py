"""Linear probes: how much task information each layer's frozen output carries, with no fine-tuning at all.

For every layer l of a model: the pooled output of exit l (its pooler on [CLS], what a linear exit reads) and the
mean of layer l's hidden states over the real tokens. A scikit-learn logistic regression (features standardised,
C picked by stratified cross-validation on the training subset only) is fit on a seeded subset of the training
set per seed, and scored on the dev set. The dev rows never influence C or anything else.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from experiments.pretrain_lab import GLUE_DIR, ProbeBudget, minilm_path, unit

FEATURES = ("pooled", "mean")
TASKS = ("SST-2", "MRPC")


def extract(model_dir: Path, examples: list, max_length: int) -> dict[str, np.ndarray]:
    """{"pooled": [L, N, H], "mean": [L, N, H]} for `examples`, every layer, in dataset order (fp32, no grad)."""
    import torch

    from elasticbert import ElasticBertModel, load_pretrained
    from finetune.data import EncodedSplit, in_dataset_order, load_tokenizer

    model, _ = load_pretrained(ElasticBertModel, model_dir)
    model.eval()
    split = EncodedSplit.from_examples(load_tokenizer(minilm_path()), examples, max_length)
    layers = tuple(range(1, model.config.num_hidden_layers + 1))
    outputs = []
    with torch.no_grad():
        batches = split.batches(64)
        for b in batches:
            out = model(
                b.input_ids,
                attention_mask=b.attention_mask,
                token_type_ids=b.token_type_ids,
                exit_layers=layers,
                output_pooled=True,
            )
            mask = b.attention_mask.unsqueeze(-1).float()
            means = [(h * mask).sum(1) / mask.sum(1) for h in out.exit_hidden_states]
            outputs.append((torch.stack(out.pooled_outputs), torch.stack(means)))
    ordered = in_dataset_order([(p.transpose(0, 1), m.transpose(0, 1)) for p, m in outputs], batches)
    pooled, mean = ordered
    return {"pooled": pooled.transpose(0, 1).numpy(), "mean": mean.transpose(0, 1).numpy()}


def fit_probe(x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray, budget: ProbeBudget, seed: int) -> dict:
    """Standardise, pick C by stratified k-fold CV on train, refit, predict dev."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folds = StratifiedKFold(n_splits=budget.cv_folds, shuffle=True, random_state=seed)
    warnings.filterwarnings("ignore", category=FutureWarning, module="sklearn")  # use_legacy_attributes notice
    clf = LogisticRegressionCV(Cs=list(budget.cs), cv=folds, max_iter=2000, n_jobs=1, scoring="accuracy")
    pipe = make_pipeline(StandardScaler(), clf)
    pipe.fit(x_train, y_train)
    return {
        "C": float(clf.C_[0]),
        "train_accuracy": float(pipe.score(x_train, y_train)),
        "dev_pred": pipe.predict(x_dev),
    }


def probe_model(work: Path, budget: ProbeBudget, model_name: str, model_dir: Path, task: str, seeds: tuple) -> dict:
    """Every layer x feature x seed of one model on one task: one unit (features are extracted once)."""

    def compute() -> dict:
        from finetune.data import subsample
        from finetune.tasks import compute_metrics, get_task, load_split

        spec = get_task(task)
        train_all = load_split(spec, GLUE_DIR, "train")
        dev = subsample(load_split(spec, GLUE_DIR, "dev"), budget.dev_examples, 0)
        subsets = {s: subsample(train_all, budget.train_examples[task], s) for s in seeds}
        union = sorted({id(e): e for rows in subsets.values() for e in rows}.values(), key=lambda e: id(e))
        position = {id(e): i for i, e in enumerate(union)}
        feats_train = extract(model_dir, union, budget.max_length[task])
        feats_dev = extract(model_dir, dev, budget.max_length[task])
        y_dev = np.array([e.label for e in dev])
        runs = []
        for seed, rows in subsets.items():
            idx = np.array([position[id(e)] for e in rows])
            y = np.array([e.label for e in rows])
            for kind in FEATURES:
                for layer in range(feats_train[kind].shape[0]):
                    fit = fit_probe(feats_train[kind][layer][idx], y, feats_dev[kind][layer], budget, seed)
                    metrics = compute_metrics(spec, fit.pop("dev_pred"), y_dev)
                    runs.append(
                        {
                            "seed": seed,
                            "feature": kind,
                            "layer": layer + 1,
                            **fit,
                            **{k: float(v) for k, v in metrics.items()},
                        }
                    )
        return {
            "model": model_name,
            "task": task,
            "train_examples": budget.train_examples[task],
            "train_rows_featurised": len(union),
            "dev_examples": len(dev),
            "runs": runs,
        }

    return unit(work, f"probe_{model_name}_{task}", compute)
