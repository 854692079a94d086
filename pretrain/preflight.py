"""`python -m pretrain preflight`: check every node of a job in seconds, before 64 ranks start and fail one by one.

Run once per node (slurm/pretrain_base.sh: `srun --ntasks-per-node=1`) with the training command's arguments. Each
node checks itself — its GPUs against the tasks it will run, the torch build against those GPUs, the precision the
config resolves to there, every corpus (manifest and shards readable), the run directory (writable, room for two
checkpoints), the initial weights, DeepSpeed's fused ops when the config asks for them (built here, once per node)
— then the nodes meet where the training ranks will meet (a TCPStore on MASTER_ADDR:MASTER_PORT: the same address
and port, so reaching it proves the rendezvous path) and node 0 compares what must be alike on every node: torch,
CUDA, NCCL and driver versions, the code, the resolved config. Every node prints one line; node 0 prints the job's
verdict last, naming the first node that failed and why. Exit 0 when all passed, 2 otherwise, so the job stops
before any rank trains.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from common.dist import resolve_env
from common.model_size import pretraining_parameters
from common.torch_build import query_driver, running_build_check

from .config import REPO_ROOT, RunConfig

GATHER_TIMEOUT_S = 20.0  # how long node 0 waits for the others' reports (a node that cannot reach it says so)
CHECKPOINT_BYTES_PER_PARAM = 16  # measured: base ZeRO-1/2 checkpoint 1879 MB for 123 M parameters (docs/scale.md)
BERT_VOCAB = 30522
CODE_PACKAGES = ("common", "elasticbert", "data_prep", "pretrain")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class NodeReport:
    host: str
    node_rank: int
    checks: list[Check] = field(default_factory=list)
    alike: dict[str, str] = field(default_factory=dict)  # must be equal on every node
    seconds: float = 0.0

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def line(self) -> str:
        if self.failed:
            return f"preflight {self.host}: FAILED: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failed)
        shown = ", ".join(f"{c.name}: {c.detail}" for c in self.checks)
        return f"preflight {self.host}: ok in {self.seconds:.1f} s ({shown})"


def _run(name: str, report: NodeReport, fn: Any, *args: Any) -> Any:
    """Run one check; a user error or OS error becomes a failed check with its message, never a traceback."""
    try:
        detail, value = fn(*args)
        report.checks.append(Check(name, True, detail))
        return value
    except (ValueError, OSError) as e:  # UserError derives from ValueError
        report.checks.append(Check(name, False, str(e).strip().replace("\n", " ")))
        return None


# ------------------------------------------------------------------------------------------- the checks of one node
def check_gpus(tasks_per_node: int) -> tuple[str, Any]:
    """GPUs visible to this node's tasks = the tasks it will run; the torch build covers them."""
    import torch

    check = running_build_check(0)
    if check.problem:
        raise ValueError(check.problem)
    if os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available():
        return "no GPU (CPU node)", None
    count = torch.cuda.device_count()
    if count != tasks_per_node:
        raise ValueError(
            f"{count} GPU(s) visible but {tasks_per_node} task(s) per node: want one task per GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}; sbatch --gpus-per-node)"
        )
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    caps = sorted({".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(count)})
    notes = "".join(f"; note: {n}" for n in check.notes)
    return f"{count} x {'/'.join(names)} (sm {'/'.join(caps)}), arch list covers them{notes}", None


def check_precision(cfg: RunConfig, ds_path: str | None, world_size: int) -> tuple[str, tuple[dict[str, Any], str]]:
    """The DeepSpeed config this node's GPU resolves the run config to (refused as training would refuse it)."""
    from .ds_config import fill_ds_config, load_ds_json
    from .precision import DeviceCaps, choose_precision

    caps = DeviceCaps.detect(0)
    raw = load_ds_json(ds_path or cfg.train.ds_config)
    ds, layout = fill_ds_config(raw, cfg, world_size, caps)
    choice = choose_precision(cfg.train.precision, raw, caps)
    return f"{choice.precision} ({choice.reason}); {layout}", (ds, choice.precision)


def check_corpora(cfg: RunConfig) -> tuple[str, None]:
    """Every corpus: a valid manifest, every shard present at its recorded size, every file readable."""
    from .corpora import corpus_path, open_corpus

    parts = []
    for k, c in enumerate(cfg.data.corpora):
        path = corpus_path(c, k)
        corpus = open_corpus(path, "train")
        for name in corpus.shard_names:
            for suffix in (".bin", ".idx"):
                shard = path / "train" / f"{name}{suffix}"
                with open(shard, "rb") as f:  # readable, not only listed (a mount with wrong permissions)
                    f.read(1)
        parts.append(f"{path.name}: {corpus.num_tokens / 1e6:.1f} M tokens in {len(corpus.shard_names)} shard(s)")
    return "; ".join(parts) or "none", None


def parameter_count(cfg: RunConfig, vocab_size: int) -> int:
    """The model's size without building it (`common.model_size`: no transformers import on the node), with the
    initial checkpoint's architecture."""
    m, type_vocab = cfg.model, 2
    if m.init_from is not None:
        from .model_setup import init_source

        init_cfg = json.loads((init_source(m.init_from) / "config.json").read_text())
        names = {f.name for f in dataclasses.fields(m)}
        m = dataclasses.replace(m, **{k: v for k, v in init_cfg.items() if k in names and k != "init_from"})
        vocab_size = int(init_cfg.get("vocab_size", vocab_size))
        type_vocab = int(init_cfg.get("type_vocab_size", type_vocab))
    vocab = m.vocab_size or vocab_size
    return pretraining_parameters(
        m.hidden_size, m.intermediate_size, m.num_hidden_layers, vocab, m.max_position_embeddings, type_vocab
    )


def check_run_dir(run_dir: Path, cfg: RunConfig) -> tuple[str, None]:
    """Writable (a probe file written, read back, removed) with room for two checkpoints."""
    from .corpora import corpus_path, open_corpus

    vocab = BERT_VOCAB  # the size estimate only; an unreadable corpus is the data check's finding
    try:
        vocab = open_corpus(corpus_path(cfg.data.corpora[0], 0), "train").vocab_size
    except (ValueError, OSError, IndexError):
        pass
    need = 2 * CHECKPOINT_BYTES_PER_PARAM * parameter_count(cfg, vocab)
    run_dir.mkdir(parents=True, exist_ok=True)
    probe = run_dir / f".preflight-{socket.gethostname()}-{os.getpid()}"
    try:
        probe.write_bytes(b"preflight\n")
        if probe.read_bytes() != b"preflight\n":
            raise OSError(f"{probe}: read back differs from what was written")
    finally:
        probe.unlink(missing_ok=True)
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise ValueError(
            f"{run_dir}: {free / 2**30:.2f} GiB free, two checkpoints need {need / 2**30:.2f} GiB "
            f"({CHECKPOINT_BYTES_PER_PARAM} bytes per parameter each): free space or choose another RUN_DIR"
        )
    return f"{run_dir} writable, {free / 2**30:.1f} GiB free (2 checkpoints: {need / 2**30:.2f} GiB)", None


def check_fused_ops(cfg: RunConfig) -> tuple[str, None]:
    """optim.backend=deepspeed: build FusedAdam/FusedLamb here, once per node, for this node's GPUs (their own
    TORCH_CUDA_ARCH_LIST), so the ranks only load it; a failed build is one line naming the op, the arch and the
    first line of the compiler's complaint."""
    if cfg.optim.kernel_backend() != "deepspeed":
        return "torch (no op to build)", None
    op = "fused_lamb" if cfg.optim.name == "lamb" else "fused_adam"
    accelerator = os.environ.get("DS_ACCELERATOR", "cuda")
    if accelerator != "cpu" and not _nvcc():
        raise ValueError(
            f"optim.backend=deepspeed builds DeepSpeed's {op} op with nvcc, and this node has none (CUDA_HOME="
            f"{os.environ.get('CUDA_HOME', 'unset')}, no nvcc on PATH): `module load cuda` in the job script, "
            "or use optim.backend=torch (the default: torch's fused AdamW, no compiler)"
        )
    from common.deepspeed_import import quiet_deepspeed

    from .ds_runtime import set_op_build_arch

    arch, note = "cpu", None
    if accelerator != "cpu":
        arch, note = set_op_build_arch()
    quiet_deepspeed(accelerator)
    from deepspeed.ops.op_builder import FusedAdamBuilder, FusedLambBuilder

    builder = FusedLambBuilder() if op == "fused_lamb" else FusedAdamBuilder()
    start = time.monotonic()
    try:
        builder.load(verbose=False)
    except Exception as e:  # noqa: BLE001  (ninja's CalledProcessError, torch's RuntimeError, DeepSpeed's ValueError)
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(
            f"DeepSpeed's {op} op failed to build for TORCH_CUDA_ARCH_LIST={arch} ({type(e).__name__}: "
            f"{first[:200]}); the compiler's log is under {_extension_dir()}: fix the toolchain (an nvcc of torch's "
            f"CUDA {_torch_cuda()}), or use optim.backend=torch (torch's fused AdamW, no build)"
        ) from None
    built = f"{op} built/loaded in {time.monotonic() - start:.0f} s for {arch}"
    return built + (f" ({note})" if note else ""), None


def _extension_dir() -> str:
    from .guards import extension_build_root

    return str(extension_build_root())


def _torch_cuda() -> str:
    import torch

    return str(torch.version.cuda)


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


# ------------------------------------------------------------------------------------ what must be alike everywhere
def versions() -> dict[str, str]:
    import torch

    found = {"python": ".".join(map(str, sys.version_info[:3])), "torch": torch.__version__}
    found["cuda"] = str(torch.version.cuda)
    if torch.cuda.is_available():
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        found["driver"] = query_driver() or "unknown"
    try:
        found["deepspeed"] = metadata.version("deepspeed")  # without importing it (slow, prints banners)
    except metadata.PackageNotFoundError:
        found["deepspeed"] = "missing"
    return found


def code_version() -> str:
    """The commit (when there is one) and a hash of every source file the training ranks import: two nodes that
    run different code differ here even with the same commit (a local edit, a stale copy)."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return f"{commit or 'no git'}+src:{digest.hexdigest()[:12]}"


def config_hash(cfg: RunConfig, ds: dict[str, Any] | None) -> str:
    blob = json.dumps({"config": cfg.to_dict(), "deepspeed": ds}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------- one node
def check_node(cfg: RunConfig, run_dir: Path, ds_path: str | None, tasks_per_node: int, world: int) -> NodeReport:
    start = time.monotonic()
    env = resolve_env()
    report = NodeReport(socket.gethostname(), int(os.environ.get("NODE_RANK", env.rank // max(tasks_per_node, 1))))
    _run("gpus", report, check_gpus, tasks_per_node)
    ds, precision = _run("precision", report, check_precision, cfg, ds_path, world) or (None, "unresolved")
    _run("data", report, check_corpora, cfg)
    _run("run dir", report, check_run_dir, run_dir, cfg)
    _run("optimizer", report, check_fused_ops, cfg)
    report.alike = {**versions(), "code": code_version(), "config": config_hash(cfg, ds), "precision": precision}
    report.seconds = time.monotonic() - start
    return report


# ------------------------------------------------------------------------------------------------ all the nodes
def differences(reports: list[dict[str, Any]]) -> list[str]:
    """What is not alike across the nodes' reports: one line per key, naming the nodes of each value."""
    out = []
    keys = sorted({k for r in reports for k in r["alike"]})
    for key in keys:
        by_value: dict[str, list[str]] = {}
        for r in reports:
            by_value.setdefault(str(r["alike"].get(key)), []).append(r["host"])
        if len(by_value) > 1:
            shown = "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in by_value.items())
            out.append(f"{key} differs across nodes: {shown}")
    return out


def verdict(reports: list[dict[str, Any] | None], hosts_expected: int) -> tuple[bool, str]:
    """The job's one line: the first failed node and its reason, else what differs, else ok."""
    missing = [str(i) for i, r in enumerate(reports) if r is None]
    present = [r for r in reports if r is not None]
    for r in present:
        if r["failed"]:
            return False, f"preflight FAILED on {r['host']} (node {r['node_rank']}): {r['failed'][0]}"
    if missing:
        return False, (
            f"preflight FAILED: node(s) {', '.join(missing)} of {hosts_expected} sent no report within "
            f"{GATHER_TIMEOUT_S:.0f} s (down, or cannot reach MASTER_ADDR={os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')}: its own line says which)"
        )
    diffs = differences(present)
    if diffs:
        return False, "preflight FAILED: " + " | ".join(diffs)
    slowest = max(r["seconds"] for r in present)
    return True, f"preflight ok: {len(present)} node(s) agree (slowest node {slowest:.1f} s)"


def gather(report: NodeReport, num_nodes: int) -> tuple[bool, str]:
    """Meet the other nodes on MASTER_ADDR:MASTER_PORT; node 0 decides, everyone gets its verdict."""
    from torch.distributed import TCPStore

    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    mine = {"host": report.host, "node_rank": report.node_rank, "alike": report.alike, "seconds": report.seconds}
    mine["failed"] = [f"{c.name}: {c.detail}" for c in report.failed]
    is_master = report.node_rank == 0
    timeout = timedelta(seconds=GATHER_TIMEOUT_S)
    try:
        store = TCPStore(addr, port, num_nodes, is_master, timeout=timeout, wait_for_workers=False)
    except Exception as e:  # noqa: BLE001  (DistNetworkError, RuntimeError: torch's types for "cannot connect")
        reason = str(e).split("\n")[0][:200]
        return False, f"preflight FAILED on {report.host}: cannot reach MASTER_ADDR={addr}:{port}: {reason}"
    store.set(f"node/{report.node_rank}", json.dumps(mine))
    if not is_master:
        try:
            store.wait(["verdict"], timedelta(seconds=GATHER_TIMEOUT_S + 10))
            ok, line = json.loads(store.get("verdict"))
            store.set(f"done/{report.node_rank}", "1")
            return ok, line
        except Exception:  # noqa: BLE001
            return False, f"preflight FAILED on {report.host}: no verdict from node 0 at {addr}:{port}"
    reports = _collect(store, num_nodes)
    ok, line = verdict(reports, num_nodes)
    store.set("verdict", json.dumps([ok, line]))
    _wait_for(store, [f"done/{i}" for i in range(1, num_nodes) if reports[i] is not None], 5.0)
    return ok, line


def _collect(store: Any, num_nodes: int) -> list[dict[str, Any] | None]:
    keys = [f"node/{i}" for i in range(num_nodes)]
    _wait_for(store, keys, GATHER_TIMEOUT_S)
    return [json.loads(store.get(k)) if store.check([k]) else None for k in keys]


def _wait_for(store: Any, keys: list[str], seconds: float) -> None:
    """Until every key is set or `seconds` passed (store.wait would raise on the first missing key)."""
    end = time.monotonic() + seconds
    while keys and not store.check(keys) and time.monotonic() < end:
        time.sleep(0.1)


def preflight(cfg: RunConfig, run_dir: Path, ds_path: str | None) -> int:
    """Check this node, meet the others, print this node's line and (node 0) the job's verdict; 0 when all passed."""
    tasks_per_node = int(os.environ.get("EB_TASKS_PER_NODE", os.environ.get("LOCAL_WORLD_SIZE", "1")))
    num_nodes = int(os.environ.get("EB_NUM_NODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    report = check_node(cfg, run_dir, ds_path, tasks_per_node, tasks_per_node * num_nodes)
    print(report.line(), flush=True)
    ok, line = gather(report, num_nodes)
    if report.node_rank == 0 or not ok:
        print(line, flush=True)
    return 0 if ok else 2
