"""What makes a directory we saved load with plain `transformers`, no `import elasticbert` first — the way the
Hugging Face ecosystem serves custom architectures: `config.json` names the classes in `auto_map`, and two small
files beside it (`configuration_elasticbert.py`, `modeling_elasticbert.py`) import them from this package.

    AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True)
    transformers.pipeline("text-classification", model=DIR, trust_remote_code=True)

Without `trust_remote_code=True`, transformers refuses in one line that says to pass it; without this package
installed, the files say `pip install` what (transformers checks a remote file's imports before running it). With
`import elasticbert` done, the registered classes are used as before and nothing is executed from the directory.

The files import the package's classes rather than copies of them, so loading through them runs the package's
`from_pretrained`, which verifies a sealed directory's checksums.json first (`verification`): remote code loads no
weights that `load_pretrained` would refuse (`pipeline(..., model_kwargs={"verify_checksums": False})` loads them
anyway).
"""

from __future__ import annotations

from pathlib import Path

AUTO_MAP = {
    "AutoConfig": "configuration_elasticbert.ElasticBertConfig",
    "AutoModel": "modeling_elasticbert.ElasticBertModel",
    "AutoModelForPreTraining": "modeling_elasticbert.ElasticBertForPreTraining",
    "AutoModelForSequenceClassification": "modeling_elasticbert.ElasticBertForSequenceClassification",
}
INSTALL_HINT = "pip install elasticbert-pipeline (the package that provides `import elasticbert`)"

FILES = {
    "configuration_elasticbert.py": f'''"""ElasticBERT's config for `trust_remote_code=True` loading: the class of the
elasticbert package ({INSTALL_HINT})."""

from elasticbert.configuration import ElasticBertConfig

__all__ = ["ElasticBertConfig"]
''',
    "modeling_elasticbert.py": f'''"""ElasticBERT's model classes for `trust_remote_code=True` loading: those of the
elasticbert package ({INSTALL_HINT}), whose `from_pretrained` verifies this directory's checksums.json first
(`verify_checksums=False` loads it anyway)."""

from elasticbert.modeling import ElasticBertForPreTraining, ElasticBertForSequenceClassification, ElasticBertModel

__all__ = ["ElasticBertForPreTraining", "ElasticBertForSequenceClassification", "ElasticBertModel"]
''',
}


def write_remote_code(directory: str | Path) -> None:
    """The two files `auto_map` names, into a directory `save_pretrained` wrote."""
    for name, text in FILES.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
