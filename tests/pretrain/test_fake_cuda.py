"""Every GPU-only line of the library runs in CI: a V100 (7.0), an A100 (8.0) and an H200 (9.0) faked on the CPU
(tests/support/fake_cuda.py: torch.cuda's public functions, torch.version, a stub nvidia-smi) drive the build check,
`DeviceCaps.detect`, the precision choice, the DeepSpeed config, the preflight, DeepSpeed's op build for the node's
own arch, and the trainer's set-up up to the engine; and a trace of the library's lines, on the CPU and under each
fake, proves which lines only a GPU runs and that the fakes run every one of them (docs/gpu.md)."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_cuda import CU130_ARCHES, GPUS, fake_cuda
from pretrain_testlib import REPO, TINY
from tiny_models import tiny_config

from common.errors import ConfigError
from common.torch_build import DRIVER_UNKNOWN, TorchBuildError
from pretrain import preflight
from pretrain.config import load_config
from pretrain.ds_config import fill_ds_config, load_ds_json
from pretrain.mfu import peak_flops
from pretrain.precision import DeviceCaps, choose_precision

sys.path.insert(0, str(REPO))
from bench.trainer_overhead import synthetic_corpus  # noqa: E402

KINDS = sorted(GPUS)
AUTO = {"v100": "fp16", "a100": "bf16", "h200": "bf16"}
PEAK_TFLOPS = {"v100": 125.0, "a100": 312.0, "h200": 989.0}
ARCH = {"v100": "7.0", "a100": "8.0", "h200": "9.0"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return synthetic_corpus(tmp_path_factory.mktemp("synthetic"), docs=60)


def config(corpus: Path, *sets: str) -> Any:
    """The tiny config on the synthetic corpus, at a global batch 8 ranks can share."""
    data = f"data.corpora=[{{name: synthetic, path: {corpus}, weight: 1.0}}]"
    return load_config(TINY, [data, "train.global_batch_size=64", *sets])


@pytest.mark.parametrize("kind", KINDS)
def test_the_device_its_precision_and_the_deepspeed_config(kind, tmp_path, corpus, monkeypatch):
    fake = fake_cuda(monkeypatch, tmp_path, kind)
    caps = DeviceCaps.detect(3)
    assert (caps.kind, caps.name, caps.capability, caps.notes) == ("cuda", fake.gpu.name, ARCH[kind], ())
    assert caps.native_bf16 is (kind != "v100")
    cfg = config(corpus, "train.global_batch_size=256")
    raw = load_ds_json("ds_configs/zero1.json")
    assert choose_precision("auto", raw, caps).precision == AUTO[kind]
    ds, layout = fill_ds_config(raw, cfg, 64, caps)
    assert (layout.grad_accum, ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == (
        1,
        AUTO[kind] == "bf16",
        kind == "v100",
    )
    assert ds["optimizer"]["params"]["torch_adam"] is True and ds["optimizer"]["params"]["fused"] is True
    assert ds["timers"] == {"throughput": {"enabled": False}}  # no device synchronize around every micro-batch
    if kind == "v100":
        assert ds["fp16"]["loss_scale"] == 0 and ds["fp16"]["initial_scale_power"] == 16
        with pytest.raises(ConfigError, match="would only emulate it"):
            fill_ds_config(raw, config(corpus, "train.precision=bf16"), 1, caps)
    else:
        assert ds["bf16"]["check_grad_overflow"] is False  # no host read of an overflow flag per step
    assert peak_flops(None, "cuda", AUTO[kind]) == PEAK_TFLOPS[kind] * 1e12


@pytest.mark.parametrize("kind", KINDS)
def test_the_build_check_reads_the_driver_from_nvidia_smi_and_never_crashes(kind, tmp_path, monkeypatch):
    fake = fake_cuda(monkeypatch, tmp_path, kind)
    assert DeviceCaps.detect(0).notes == ()
    fake.smi(None)  # no nvidia-smi: the driver is unknown, that check skipped with a note
    assert DeviceCaps.detect(0).notes == (DRIVER_UNKNOWN,)
    fake.smi(script="echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18")
    assert DeviceCaps.detect(0).notes == (DRIVER_UNKNOWN,)
    fake.smi("520.61.05")  # older than either build needs
    with pytest.raises(TorchBuildError, match=r"driver 520\.61\.05 is older than torch's CUDA .* needs") as old:
        DeviceCaps.detect(0)
    assert "\n" not in str(old.value)
    fake.smi()
    if kind == "v100":  # the PyPI default (CUDA 13) on a V100: refused on every rank, one line with the fix
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(CU130_ARCHES))
        with pytest.raises(TorchBuildError, match="no kernels for compute capability 7.0.*TORCH_CUDA=cu126"):
            DeviceCaps.detect(0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_preflight_on_a_node_of_eight(kind, tmp_path, corpus, monkeypatch, clean_env):
    fake = fake_cuda(monkeypatch, tmp_path, kind)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    report = preflight.check_node(config(corpus), tmp_path / "run", None, 8, 8)
    assert not report.failed, report.line()
    checks = {c.name: c.detail for c in report.checks}
    assert checks["gpus"] == f"8 x {fake.gpu.name} (sm {ARCH[kind]}), arch list covers them"
    assert checks["precision"].startswith(f"{AUTO[kind]} (auto: {fake.gpu.name}")
    want = {"cuda": fake.gpu.torch_cuda, "nccl": "2.27.7", "driver": fake.gpu.driver, "precision": AUTO[kind]}
    assert {k: report.alike[k] for k in want} == want
    fake.smi(None)
    unknown = preflight.check_node(config(corpus), tmp_path / "run", None, 8, 8)
    assert unknown.alike["driver"] == "unknown" and f"note: {DRIVER_UNKNOWN}" in unknown.checks[0].detail
    wrong = preflight.check_node(config(corpus), tmp_path / "run", None, 4, 8)
    assert [c.name for c in wrong.failed] == ["gpus"] and "8 GPU(s) visible but 4 task(s) per node" in wrong.line()


class ReachedEngine(Exception):
    """Raised by the patched `deepspeed.initialize`: the set-up got as far as the engine."""


def stop_at_the_engine(monkeypatch: Any) -> dict[str, Any]:
    """Patch DeepSpeed's process-group init and engine: record their arguments, build neither."""
    import deepspeed

    seen: dict[str, Any] = {}
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: seen.setdefault("init", kw))

    def initialize(**kw: Any) -> None:
        seen["engine"] = kw
        raise ReachedEngine

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_the_trainer_sets_up_up_to_the_engine(kind, tmp_path, corpus, monkeypatch, clean_env):
    from pretrain.trainer import Trainer

    fake = fake_cuda(monkeypatch, tmp_path, kind)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # DeepSpeed itself stays on its CPU accelerator here
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0a")  # what a Hopper image may export
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "5", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    seen = stop_at_the_engine(monkeypatch)
    trainer = Trainer(config(corpus, "train.ds_config=ds_configs/zero1.json"), tmp_path / "run", None, False)
    try:
        with pytest.raises(ReachedEngine):
            trainer._setup()
    finally:
        trainer.lock.release()
    assert trainer.device == "cuda" and trainer.caps.name == fake.gpu.name and trainer.precision == AUTO[kind]
    assert seen["init"]["dist_backend"] == "nccl" and fake.set_device_calls == [5]
    ds = seen["engine"]["config"]
    assert ds[AUTO[kind]]["enabled"] is True and ds["optimizer"]["params"]["fused"] is True
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == ARCH[kind]  # the node's own arch for any op DeepSpeed builds
    assert [g["weight_decay"] for g in seen["engine"]["model_parameters"]] == [0.01, 0.0]


class RecordingFusedAdamBuilder:
    """DeepSpeed's CUDA FusedAdam builder whose `load` only does what fails on Hopper: parsing the arch list the way
    its JIT build does (`compute_capability_args`), recording what it saw; `fail` makes the build fail as ninja does."""

    seen: list[str] = []
    fail: str | None = None

    def __init__(self) -> None:
        from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

        self.builder = FusedAdamBuilder()
        self.builder.jit_mode = True

    def load(self, verbose: bool = False) -> None:
        type(self).seen.append(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
        self.builder.compute_capability_args()  # int("0a") raised here before issue 51
        if type(self).fail:
            raise RuntimeError(type(self).fail)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_adam_is_built_for_the_nodes_own_arch_and_a_failure_is_one_line(kind, tmp_path, corpus, monkeypatch):
    import deepspeed.ops.op_builder as op_builder

    fake_cuda(monkeypatch, tmp_path, kind)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(preflight, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(op_builder, "FusedAdamBuilder", RecordingFusedAdamBuilder)
    monkeypatch.setattr(RecordingFusedAdamBuilder, "seen", [])
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0a")
    cfg = config(corpus, "optim.backend=deepspeed", "train.ds_config=ds_configs/zero1.json")
    detail, _ = preflight.check_fused_ops(cfg)
    assert RecordingFusedAdamBuilder.seen == [ARCH[kind]]
    assert f"for {ARCH[kind]} (TORCH_CUDA_ARCH_LIST='8.0 9.0a' that DeepSpeed cannot parse" in detail
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.0;8.0;9.0+PTX")  # one that DeepSpeed parses and covers the node
    assert preflight.check_fused_ops(cfg)[0].endswith("for 7.0;8.0;9.0+PTX")
    monkeypatch.setattr(RecordingFusedAdamBuilder, "fail", "Error building extension 'fused_adam'\n[1/3] nvcc ...")
    report = preflight.check_node(cfg, tmp_path / "run", None, 8, 8)
    assert [c.name for c in report.failed] == ["optimizer"], report.line()
    line = report.line()
    assert "\n" not in line and "fused_adam op failed to build for TORCH_CUDA_ARCH_LIST=7.0;8.0;9.0+PTX" in line
    assert "(RuntimeError: Error building extension 'fused_adam')" in line and "optim.backend=torch" in line


def test_deepspeeds_own_parser_refused_the_hopper_images_list_and_takes_ours(monkeypatch):
    """The failure seen on the H200 (issue 51), reproduced with DeepSpeed's real builder: its JIT arch parsing stops
    at '9.0a'; the list `set_op_build_arch` writes from the capability passes it."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    from pretrain.ds_runtime import set_op_build_arch

    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ValueError, match="invalid literal for int.*'0a'"):
        builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert set_op_build_arch([(9, 0)]) == (
        "9.0",
        "TORCH_CUDA_ARCH_LIST='9.0a' that DeepSpeed cannot parse: building for 9.0",
    )
    assert builder.compute_capability_args() == [] and os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0+PTX"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert set_op_build_arch([(7, 0), (7, 0)]) == (
        "7.0",
        "TORCH_CUDA_ARCH_LIST='8.0' that misses this node's GPUs: building for 7.0",
    )
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    assert set_op_build_arch([(8, 0), (9, 0)]) == ("8.0;9.0", None)


def test_finetunings_gpu_lines(tmp_path, monkeypatch):
    from finetune.model import resolve_device
    from finetune.train.checkpoint import rng_states, set_rng_states

    fake = fake_cuda(monkeypatch, tmp_path, "a100", count=4)
    assert resolve_device("auto", 6) == torch.device("cuda", 2) and resolve_device("cuda", 1) == torch.device("cuda", 1)
    states = rng_states()
    assert len(states["cuda"]) == 4
    set_rng_states(states)
    assert fake.rng_states is not None and len(fake.rng_states) == 4


# ------------------------------------------------------------------------------------ which lines only a GPU runs
LIBRARY = ("common", "elasticbert", "data_prep", "pretrain", "finetune", "demo")
# a line that names CUDA (a candidate for a GPU-only line; comments and docstrings aside)
CUDA_WORDS = re.compile(
    r'torch\.cuda\.|[=!]= *"c(uda|pu)"|"nccl"|\.hip\b|is_bf16_supported|get_device_(name|capability|properties)|'
    r'"cuda" if'
)
# lines that only real CUDA tensors reach (kernels), which no CPU test can run: none today
KERNEL_LINES: dict[str, str] = {}
# lines the fakes must reach that the CPU does not: one per GPU-only place
ANCHORS = [
    ("common/torch_build.py", "driver = query_driver()"),
    ("pretrain/precision.py", 'return cls("cuda", props.name'),
    ("pretrain/ds_config.py", 'fill.fill(params, "optimizer.params", "fused", True'),
    ("pretrain/mfu.py", "name = torch.cuda.get_device_name()"),
    ("pretrain/preflight.py", "count = torch.cuda.device_count()"),
    ("pretrain/preflight.py", 'found["nccl"] ='),
    ("pretrain/preflight.py", "arch, note = set_op_build_arch()"),
    ("pretrain/startup.py", "torch.cuda.set_device(self.env.local_rank)"),
    ("pretrain/startup.py", "set_op_build_arch()  #"),
    ("pretrain/ds_runtime.py", "capabilities = [torch.cuda.get_device_capability(i)"),
    ("finetune/model.py", 'return torch.device("cuda"'),
    ("finetune/train/checkpoint.py", 'torch.cuda.set_rng_state_all(states["cuda"])'),
    ("elasticbert/layer_runner.py", "self.graph = torch.cuda.CUDAGraph()"),
    ("elasticbert/layer_runner.py", "return GraphedLayers(model)"),
]


def code_lines(source: str) -> set[int]:
    """Lines that hold code (not only a comment or a docstring)."""
    docs = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - docs


def cuda_candidates() -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """(the library's lines that name CUDA or a device kind, every line of the functions holding one)."""
    found, scope = set(), set()
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            source, rel = path.read_text(encoding="utf-8"), str(path.relative_to(REPO))
            code = code_lines(source)
            hits = {
                n
                for n, line in enumerate(source.splitlines(), 1)
                if n in code and CUDA_WORDS.search(line.split("#")[0])
            }
            found |= {(rel, n) for n in hits}
            functions = [
                f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            for n in hits:  # the innermost function around each
                around = [f for f in functions if f.lineno <= n <= f.end_lineno]
                if around:
                    f = max(around, key=lambda f: f.lineno)
                    scope |= {(rel, m) for m in range(f.lineno, f.end_lineno + 1)}
    return found, scope


def traced(fn: Any) -> set[tuple[str, int]]:
    """The library lines `fn()` runs (a line tracer on the library's files only)."""
    roots = tuple(f"{REPO / package}/" for package in LIBRARY)
    lines: set[tuple[str, int]] = set()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.startswith(roots):
            lines.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return None

    sys.settrace(on_call)
    try:
        fn()
    finally:
        sys.settrace(None)
    return {(str(Path(f).relative_to(REPO)), n) for f, n in lines}


class NoBuild:
    """The CPU run's DeepSpeed op builder: nothing to build (its CPU op takes 46 s to compile)."""

    def load(self, verbose: bool = False) -> None:
        return None


def scenario(tmp_path: Path, corpus: Path, monkeypatch: Any, kind: str | None) -> None:
    """What a node does before its first kernel, on this device: the build check and the device, the precision and
    the DeepSpeed config, the MFU peak, the preflight (with DeepSpeed's fused op), the trainer's set-up up to the
    engine, fine-tuning's device and RNG states."""
    import deepspeed.ops.op_builder as op_builder

    from finetune.model import resolve_device
    from finetune.train.checkpoint import rng_states, set_rng_states
    from pretrain.data import train_loader
    from pretrain.trainer import Trainer

    where = tmp_path / (kind or "cpu")
    gpus = 8 if kind else 1
    cfg = config(corpus, "train.ds_config=ds_configs/zero1.json", "optim.backend=deepspeed")
    monkeypatch.setattr(op_builder, "FusedAdamBuilder", RecordingFusedAdamBuilder if kind else NoBuild)
    monkeypatch.setattr(preflight, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setenv("DS_ACCELERATOR", "cuda" if kind else "cpu")
    caps = DeviceCaps.detect(0)
    caps.describe()
    fill_ds_config(load_ds_json("ds_configs/zero1.json"), config(corpus), gpus, caps)
    if not caps.native_bf16:  # bf16 asked of a GPU without it (a V100), or of a CPU: refused / allowed
        with contextlib.suppress(ConfigError):
            fill_ds_config(load_ds_json("ds_configs/zero1.json"), config(corpus, "train.precision=bf16"), gpus, caps)
    peak_flops(None, caps.kind, "bf16")
    with monkeypatch.context() as no_nvcc:
        no_nvcc.setattr(preflight, "_nvcc", lambda: None)
        with contextlib.suppress(ValueError):
            preflight.check_fused_ops(cfg)
    report = preflight.check_node(cfg, where / "run", None, gpus, gpus)
    assert not report.failed, report.line()
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    stop_at_the_engine(monkeypatch)
    trainer = Trainer(config(corpus, "train.ds_config=ds_configs/zero1.json"), where / "train", None, False)
    try:
        with pytest.raises(ReachedEngine):
            trainer._setup()
    finally:
        trainer.lock.release()
    train_loader([], [], None, 0)  # built (not iterated): page-locked batches on a GPU
    resolve_device("auto", 0)
    set_rng_states(rng_states())
    model_step(caps.kind)
    if kind:
        graphed_serving_step(monkeypatch)


def model_step(device_kind: str) -> None:
    """A tiny model's training step (on the CPU's kernels: the fakes have none) and its int8 check for the device:
    the model's own device tests run here as they do on a GPU."""
    from elasticbert import ElasticBertConfig, ElasticBertForPreTraining
    from elasticbert.precision import precision_problem

    torch.manual_seed(0)
    model = ElasticBertForPreTraining(
        ElasticBertConfig(
            vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
        )
    )
    ids = torch.randint(5, 99, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    labels = torch.where(torch.rand(2, 8) < 0.3, ids, -100)
    labels[0, 1] = ids[0, 1]
    out = model(input_ids=ids, attention_mask=mask, mlm_labels=labels, sop_labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert precision_problem("int8", device_kind) == (
        None if device_kind == "cpu" else precision_problem("int8", "cuda")
    )


def graphed_serving_step(monkeypatch: Any) -> None:
    """A serving classifier on the (fake) GPU: `serving_runner` picks `GraphedLayers`, whose first call of a shape
    captures a CUDA graph (the fake runs the capture eagerly, on the CPU's kernels) and answers as the eager step; the
    next call of that shape replays the graph."""
    from elasticbert import ElasticBertForSequenceClassification
    from elasticbert.layer_runner import GraphedLayers, TorchLayers, serving_runner

    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(tiny_config(num_hidden_layers=2, exit_layers=[1, 2])).eval()
    ids = torch.randint(5, 99, (3, 7))
    mask = torch.ones_like(ids)
    mask[2, 4:] = 0
    inputs = (ids, torch.zeros_like(ids), None)
    with monkeypatch.context() as on_gpu:
        on_gpu.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
        runner = serving_runner(model)
        assert isinstance(runner, GraphedLayers) and runner.capture
        with torch.inference_mode():
            captured = runner.step(0, inputs, mask, True, True)
            eager = TorchLayers(model).step(0, inputs, mask, True, True)
            runner.step(0, inputs, mask, True, True)
    torch.testing.assert_close(captured.logits, eager.logits)
    torch.testing.assert_close(captured.hidden[mask.bool()], eager.hidden[mask.bool()])
    (static,) = runner.shapes.values()
    assert static.graph.captured and static.graph.replays == 2


def test_every_gpu_only_line_of_the_library_runs_under_the_fakes(tmp_path, corpus, monkeypatch, clean_env):
    with monkeypatch.context() as warm:  # first-run work (the corpus's verification, its index) out of the way
        scenario(tmp_path / "warm", corpus, warm, None)
    with monkeypatch.context() as cpu:
        on_cpu = traced(lambda: scenario(tmp_path, corpus, cpu, None))
    on_gpus = set()
    for kind in KINDS:
        with monkeypatch.context() as gpu:
            fake_cuda(gpu, tmp_path, kind)
            on_gpus |= traced(lambda: scenario(tmp_path, corpus, gpu, kind))  # noqa: B023
    candidates, scope = cuda_candidates()
    gpu_only = (on_gpus - on_cpu) & scope  # in a function that tests the device: what only a GPU made run
    lines_of = {}
    for file, anchor in ANCHORS:
        numbers = [n for n, text in enumerate((REPO / file).read_text().splitlines(), 1) if anchor in text]
        assert len(numbers) == 1, f"{file}: anchor {anchor!r} found {len(numbers)} times"
        lines_of[(file, numbers[0])] = anchor
    missing = [f"{f}:{n} {a}" for (f, n), a in lines_of.items() if (f, n) not in gpu_only]
    assert not missing, "GPU-only lines the fakes do not reach (or the CPU reaches too):\n" + "\n".join(missing)
    never = sorted(candidates - on_gpus - on_cpu - set(KERNEL_LINES))
    assert not never, "lines naming CUDA that neither the CPU nor the fakes run:\n" + "\n".join(
        f"{f}:{n}: {(REPO / f).read_text().splitlines()[n - 1].strip()}" for f, n in never
    )
    page = (REPO / "docs" / "gpu.md").read_text()
    claim = re.search(r"\*\*(\d+) lines of the library run only on a GPU\*\*", page)
    assert claim and int(claim.group(1)) == len(gpu_only) + len(KERNEL_LINES), (
        f"docs/gpu.md says {claim.group(1) if claim else 'nothing'}; measured {len(gpu_only)} + {len(KERNEL_LINES)}:\n"
        + "\n".join(f"{f}:{n}" for f, n in sorted(gpu_only))
    )
