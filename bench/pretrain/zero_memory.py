"""Memory and checkpoint figures for ElasticBERT-base and -large under DeepSpeed ZeRO-0/1/2/3, measured here on CPU
with 2 processes (gloo), next to DeepSpeed's own estimators, then projected to 64 × V100-32GB with fp16.

    python bench/pretrain/zero_memory.py --output docs/scale            # both sizes, all stages (~10 min on 2 cores)

Per (model, stage), 2 rank processes build the model, `deepspeed.initialize` it with the project's AdamW settings,
run one optimizer step (so the optimizer states exist), and report what this rank holds: parameters, gradients and
optimizer states in bytes (ZeRO partitions counted as DeepSpeed stores them), the checkpoint's size on disk, save
and load time. Activations are measured separately, in one process: the bytes autograd saves for backward in one
forward at seq 512 (saved-tensor hooks; fp32 on CPU, halved for fp16), with and without activation checkpointing,
per sample, then scaled to the configured micro-batch. The projection adds model states under fp16 mixed
precision (fp16 params + grads, fp32 master + Adam m, v: 2 + 2 + 12 bytes per parameter, the last two partitioned
by ZeRO) for 64 data-parallel ranks, and says whether each config fits in 32 GB, with the headroom.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.multiprocessing import ProcessExitedException

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import REPO, write_result  # noqa: E402

SIZES = {  # the architecture of configs/elasticbert_{base,large}.yaml
    "base": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        micro=32,
        groups=2,
        checkpointing=False,
    ),
    "large": dict(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        micro=16,
        groups=3,
        checkpointing=True,
    ),
}
SEQ, VOCAB, GPU_BYTES, WORLD = 512, 30522, 32 * 2**30, 64


def model_config(size: str) -> object:
    from elasticbert import ElasticBertConfig

    arch = {k: v for k, v in SIZES[size].items() if k not in ("micro", "groups", "checkpointing")}
    return ElasticBertConfig(vocab_size=VOCAB, max_position_embeddings=512, **arch)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def optimizer_state_bytes(optimizer: object) -> int:
    """Bytes of every tensor in the (possibly ZeRO-wrapped) optimizer's state, fp32 master partitions included."""
    seen, total = set(), 0
    inner = getattr(optimizer, "optimizer", optimizer)
    for state in inner.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += tensor_bytes(v)
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        for t in getattr(optimizer, name, []) or []:
            if torch.is_tensor(t) and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += tensor_bytes(t)
    return total


def gradient_bytes(engine: object, stage: int) -> int:
    """Bytes of the gradients this rank holds after backward: full .grad tensors under ZeRO-0; under ZeRO-1/2/3
    what DeepSpeed's ZeRO optimizer keeps (`averaged_gradients` / `grads_in_partition` / the reduction buffer), the
    `.grad` tensors being released once reduced."""
    if stage == 0:
        return sum(tensor_bytes(p.grad) for p in engine.module.parameters() if p.grad is not None)
    total = 0
    for name in ("averaged_gradients", "grads_in_partition", "ipg_buffer"):
        obj = getattr(engine.optimizer, name, None)
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else [obj]
        for item in items:
            for t in item if isinstance(item, list) else [item]:
                if torch.is_tensor(t):
                    total += tensor_bytes(t)
    return total


def rank_main(rank: int, size: str, stage: int, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    from common.deepspeed_import import import_deepspeed
    from elasticbert import ElasticBertForPreTraining, exit_groups

    deepspeed = import_deepspeed("AdamW")  # as a training rank does (no shm op build on the CPU)

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    torch.manual_seed(0)
    model = ElasticBertForPreTraining(model_config(size))
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 2e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01, "torch_adam": True},
        },
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50_000_000},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    groups = exit_groups(SIZES[size]["num_hidden_layers"], SIZES[size]["groups"])
    ids = torch.randint(1000, VOCAB, (1, 32))
    labels = torch.full_like(ids, -100)
    labels[:, 5:10] = ids[:, 5:10]
    out = engine(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        token_type_ids=torch.zeros_like(ids),
        mlm_labels=labels,
        sop_labels=torch.zeros(1, dtype=torch.long),
        active_exits=groups[0],
    )
    engine.backward(out.loss)
    grads = gradient_bytes(engine, stage)  # before the step, which clears them
    engine.step()
    params = sum(tensor_bytes(getattr(p, "ds_tensor", p)) for p in engine.module.parameters())
    opt = optimizer_state_bytes(engine.optimizer)
    ckpt = Path(out_dir) / f"ckpt_{size}_{stage}"
    torch.distributed.barrier()
    t0 = time.perf_counter()
    engine.save_checkpoint(str(ckpt), tag="t")
    torch.distributed.barrier()
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.load_checkpoint(str(ckpt), tag="t")
    torch.distributed.barrier()
    load_s = time.perf_counter() - t0
    disk = sum(f.stat().st_size for f in (ckpt / "t").rglob("*") if f.is_file()) if rank == 0 else 0
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    result = {
        "rank": rank,
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": opt,
        "save_s": save_s,
        "load_s": load_s,
        "checkpoint_bytes": disk,
        "numel": numel,
    }
    write_result(Path(out_dir) / f"result_{size}_{stage}_{rank}.json", result, indent=None)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # else gloo can abort this rank at exit (pytorch#190489)


def measure_stage(size: str, stage: int, work: Path) -> dict:
    import torch.multiprocessing as tmp

    from common.dist import free_port

    port = free_port()
    tmp.spawn(rank_main, args=(size, stage, port, str(work)), nprocs=2, join=True)
    ranks = [json.loads((work / f"result_{size}_{stage}_{r}.json").read_text()) for r in range(2)]
    shutil.rmtree(work / f"ckpt_{size}_{stage}", ignore_errors=True)
    r0 = ranks[0]
    return {
        "stage": stage,
        **{k: r0[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "save_s", "load_s", "numel")},
        "checkpoint_bytes": ranks[0]["checkpoint_bytes"],
    }


def estimators(size: str) -> dict:
    """DeepSpeed's estimators for 8 nodes × 8 GPUs (their printed tables, captured)."""
    import contextlib
    import io

    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_live

    from elasticbert import ElasticBertForPreTraining

    model = ElasticBertForPreTraining(model_config(size))
    out = {}
    for name, fn in (
        ("zero2", estimate_zero2_model_states_mem_needs_all_live),
        ("zero3", estimate_zero3_model_states_mem_needs_all_live),
    ):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            fn(model, num_gpus_per_node=8, num_nodes=8)
        out[name] = buf.getvalue().strip()
    return out


def activation_bytes_per_sample(size: str, checkpointing: bool, batch: int = 2) -> float:
    """Bytes autograd saves for backward in one training forward at seq 512 (all exits of the largest group), per
    sample, fp32 — counted with saved-tensor hooks (storage-deduplicated)."""
    from elasticbert import ElasticBertForPreTraining, exit_groups

    torch.manual_seed(0)
    model = ElasticBertForPreTraining(model_config(size)).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    groups = exit_groups(SIZES[size]["num_hidden_layers"], SIZES[size]["groups"])
    ids = torch.randint(1000, VOCAB, (batch, SEQ))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]  # ~15 % masked
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            token_type_ids=torch.zeros_like(ids),
            mlm_labels=labels,
            sop_labels=torch.zeros(batch, dtype=torch.long),
            active_exits=max(groups, key=len),
        )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for k, n in seen.items() if k not in params)
    del out
    return saved / batch


def projection(size: str, stages: list[dict], act: dict) -> dict:
    """Per-GPU bytes on 64 × V100-32GB with fp16 mixed precision (ZeRO-1, the configured stage), and headroom."""
    numel = stages[0]["numel"]
    micro = SIZES[size]["micro"]
    per_sample = act["checkpointing" if SIZES[size]["checkpointing"] else "plain"] / 2  # fp16 activations
    out = {}
    for stage in (0, 1, 2, 3):
        params = 2 * numel / (WORLD if stage == 3 else 1)
        grads = 2 * numel / (WORLD if stage >= 2 else 1)
        optim = 12 * numel / (WORLD if stage >= 1 else 1)
        states = params + grads + optim
        total = states + per_sample * micro
        out[f"zero{stage}"] = {
            "model_states_gb": states / 2**30,
            "activations_gb": per_sample * micro / 2**30,
            "total_gb": total / 2**30,
            "fits_32gb": total < GPU_BYTES * 0.9,
            "headroom_gb": (GPU_BYTES - total) / 2**30,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="base,large")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # What an earlier run measured is kept (a size and stage is rewritten when measured again): the large model
    # needs ~19 GB on 2 ranks at ZeRO-0 (a rank was at 9.2 GB when the OOM killer took it), so it is run alone on
    # an idle box with `--sizes large --stages 0`.
    previous = args.output / "zero_memory.json"
    results = json.loads(previous.read_text()) if previous.exists() else {}
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes.split(","):
            by_stage = {s["stage"]: s for s in results.get(size, {}).get("stages", [])}
            for stage in (int(s) for s in args.stages.split(",")):
                try:
                    by_stage[stage] = measure_stage(size, stage, Path(work))
                except ProcessExitedException as err:  # the OOM killer, typically
                    raise SystemExit(
                        f"zero_memory: {size} ZeRO-{stage}: {err} (out of memory? it needs the box to itself); "
                        f"what was measured before is in {args.output}"
                    ) from None
            stages = [by_stage[k] for k in sorted(by_stage)]
            act = {
                "plain": activation_bytes_per_sample(size, False),
                "checkpointing": activation_bytes_per_sample(size, True),
            }
            results[size] = {
                "stages": stages,
                "activations_per_sample_fp32": act,
                "estimators": estimators(size),
                "projection_64xV100_fp16": projection(size, stages, act),
                "micro_batch": SIZES[size]["micro"],
                "activation_checkpointing": SIZES[size]["checkpointing"],
            }
            print(json.dumps(results[size]["projection_64xV100_fp16"], indent=1), flush=True)
            write_report(results, args.output)  # after each size: a later size running out of memory loses nothing
    return 0


def write_report(results: dict, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    write_result(output / "zero_memory.json", results)
    lines = [
        "| model | ZeRO | params / rank | grads / rank | optimizer / rank | checkpoint on disk | save | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        for s in r["stages"]:
            lines.append(
                f"| {size} ({s['numel'] / 1e6:.0f} M) | {s['stage']} | {s['params_bytes'] / 2**20:.0f} MB | "
                f"{s['grads_bytes'] / 2**20:.0f} MB | {s['optimizer_bytes'] / 2**20:.0f} MB | "
                f"{s['checkpoint_bytes'] / 2**20:.0f} MB | {s['save_s']:.1f} s | {s['load_s']:.1f} s |"
            )
    lines += [
        "",
        "| model | micro-batch | activations / sample (fp16, seq 512) | ZeRO | model states / GPU | "
        "total / GPU | fits 32 GB (headroom) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        act = r["activations_per_sample_fp32"]["checkpointing" if r["activation_checkpointing"] else "plain"] / 2
        for stage, p in r["projection_64xV100_fp16"].items():
            lines.append(
                f"| {size} | {r['micro_batch']} | {act / 2**20:.0f} MB"
                f"{' (checkpointed)' if r['activation_checkpointing'] else ''} | {stage} | "
                f"{p['model_states_gb']:.1f} GB | {p['total_gb']:.1f} GB | "
                f"{'yes' if p['fits_32gb'] else 'NO'} ({p['headroom_gb']:.1f} GB) |"
            )
    (output / "zero_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
