"""Run configs, DeepSpeed JSON filling, lr schedule and launcher environments: fast, in-process."""

from __future__ import annotations

import json

import pytest

from common.dist import expand_nodelist, resolve_env
from pretrain.config import REPO_ROOT, ConfigError, load_config, validate
from pretrain.ds_config import fill_ds_config, load_ds_json
from pretrain.precision import DeviceCaps
from pretrain.schedule import learning_rate

CONFIGS = REPO_ROOT / "configs"
DS = REPO_ROOT / "ds_configs"
A100 = DeviceCaps("cuda", "NVIDIA A100-SXM4-80GB", True, "8.0")
V100 = DeviceCaps("cuda", "Tesla V100-SXM2-32GB", False, "7.0")
CPU = DeviceCaps.cpu()


def test_shipped_configs_load_and_match_the_design():
    base = load_config(CONFIGS / "elasticbert_base_scratch.yaml")
    assert (base.model.num_hidden_layers, base.exits.num_groups, base.data.max_length) == (12, 2, 512)
    assert (base.train.global_batch_size, base.train.train_steps) == (4096, 125_000)
    assert base.exit_groups() == [(1, 3, 5, 7, 9, 11, 12), (2, 4, 6, 8, 10, 12)]
    validate(base, world_size=64)  # 64 GPUs: 32 x 64 x accumulation 2
    large = load_config(CONFIGS / "elasticbert_large_scratch.yaml")
    assert large.model.num_hidden_layers == 24 and large.model.activation_checkpointing
    assert large.exit_groups() == [
        tuple(range(1, 24, 3)) + (24,),
        tuple(range(2, 24, 3)) + (24,),
        tuple(range(3, 24, 3)) + (24,),
    ]
    tiny = load_config(CONFIGS / "tiny_cpu.yaml")
    assert tiny.model.hidden_size == 64 and tiny.train.ds_config.endswith("cpu_fp32.json")
    from elasticbert import exit_groups

    for cfg in (base, large, tiny):  # our derivation agrees with the model package's
        assert cfg.exit_groups() == exit_groups(cfg.model.num_hidden_layers, cfg.exits.num_groups)
    # the from-scratch recipes are the paper's apart from the documented departures (init and optimiser)
    for scratch, paper in (("base_scratch", "base"), ("large_scratch", "large")):
        a, b = load_config(CONFIGS / f"elasticbert_{scratch}.yaml"), load_config(CONFIGS / f"elasticbert_{paper}.yaml")
        assert a.model.init_from is None and b.model.init_from is not None
        assert a.data == b.data and a.exit_groups() == b.exit_groups() and a.train == b.train
        assert (a.model.hidden_size, a.model.num_hidden_layers) == (b.model.hidden_size, b.model.num_hidden_layers)
        assert a.optim.betas == [0.9, 0.98] and b.optim.betas == [0.9, 0.999]


def test_base_config_is_the_papers_recipe():
    """configs/elasticbert_base.yaml resolves to the ElasticBERT paper's numbers (issue 17: init from BERT-base, Adam
    (0.9, 0.999), weight decay 0.01, peak lr 2e-4, linear warm-up over the first 4 %, batch 4,096, 125k steps,
    Wikipedia 12 GB + BookCorpus 4 GB + OpenWebText 38 GB + C4 110 GB weighted by size)."""
    cfg = load_config(CONFIGS / "elasticbert_base.yaml")
    assert cfg.model.init_from == "bert-base-uncased"
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.model.num_attention_heads) == (768, 12, 12)
    o = cfg.optim
    assert (o.name, o.betas, o.weight_decay, o.lr, o.decay) == ("adamw", [0.9, 0.999], 0.01, 2e-4, "linear")
    assert (cfg.train.global_batch_size, cfg.train.train_steps) == (4096, 125_000)
    assert o.warmup_for(cfg.train.train_steps) == 5000 == 0.04 * 125_000
    lrs = [learning_rate(t, 125_000, o) for t in (0, 4998, 4999, 5000, 65_000, 124_999)]
    assert lrs[0] == pytest.approx(2e-4 / 5000) and lrs[2] == lrs[3] == pytest.approx(2e-4)
    assert lrs[1] < lrs[2] and lrs[4] == pytest.approx(1e-4) and lrs[5] == pytest.approx(2e-4 / 120_000)
    mix = {c.name: (c.path, c.weight) for c in cfg.data.corpora}
    assert {k: w for k, (_, w) in mix.items()} == {"wikipedia": 12, "bookcorpus": 4, "openwebtext": 38, "c4": 110}
    assert all(path == f"${{ELASTICBERT_DATA}}/{name}" for name, (path, _) in mix.items())
    assert cfg.train.precision == "auto" and cfg.train.ds_config == "ds_configs/zero1.json"
    validate(cfg, world_size=64)
    large = load_config(CONFIGS / "elasticbert_large.yaml")
    assert large.model.init_from == "bert-large-uncased" and large.model.num_hidden_layers == 24
    assert (large.optim, large.data, large.train.train_steps) == (cfg.optim, cfg.data, 125_000)
    validate(large, world_size=64)


def test_check_config_needs_no_weights(capsys, monkeypatch, tmp_path):
    """The paper's recipe names a hub model; check-config resolves it only as a name (an empty hub cache here)."""
    from pretrain.__main__ import main

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    code = main(["check-config", "--config", str(CONFIGS / "elasticbert_base.yaml"), "--world-size", "64",
                 "--precision-for", "gpu-no-bf16"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["config"]["model"]["init_from"] == "bert-base-uncased" and out["warmup_steps"] == 5000
    assert out["deepspeed"]["fp16"]["enabled"] is True and out["deepspeed"]["bf16"]["enabled"] is False
    assert out["precision"].startswith("fp16 (auto: ") and not (tmp_path / "empty_cache").exists()


def test_overrides_are_typed_and_reach_nested_lists():
    cfg = load_config(
        CONFIGS / "tiny_cpu.yaml",
        ["optim.lr=1e-4", "data.corpora.0.path=/x", "train.zero_stage=3", "exits.groups=[[1,2,4],[3,4]]"],
    )
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.data.corpora[0].path == "/x" and cfg.train.zero_stage == 3
    assert cfg.exit_groups() == [(1, 2, 4), (3, 4)]
    baseline = load_config(CONFIGS / "tiny_cpu.yaml", ["exits.last_layer_only=true"])
    assert baseline.exit_groups() == [(4,)]
    assert baseline.semantic_hash() != load_config(CONFIGS / "tiny_cpu.yaml").semantic_hash()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.lrr=1"], "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        (["modle.hidden_size=8"], "unknown key 'modle'"),
        (["exits.groups=[[1,4],[2,4]]"], "exits.groups miss layers [3]"),
        (["exits.groups=[[1,2,3,4],[2,3]]"], "exits.groups[1] lacks the top layer 4"),
        (["exits.num_groups=4"], "exits.num_groups=4 must be within 1..3"),
        (["exits.last_layer_only=true", "exits.groups=[[1,2,3,4]]"], "exclusive"),
        (["train.global_batch_size=18"], "global_batch_size=18 is not divisible by train.micro_batch_size=4"),
        (["train.micro_batch_size=many"], "train.micro_batch_size: expected an integer"),
        (["model.hidden_size=65"], "not a multiple of num_attention_heads"),
        (["data.max_length=256"], "exceeds model.max_position_embeddings=128"),
        (["data.corpora=[]"], "at least one prepared corpus"),
        (["optim.warmup_steps=99"], "optim.warmup_steps=99 must be within 0..train.train_steps=30"),
        (["optim.name=lamb", "train.zero_stage=1"], "LAMB's per-tensor trust ratio"),
        (["optim.warmup_fraction=0.1"], "optim.warmup_steps and optim.warmup_fraction are exclusive"),
        (["optim.warmup_steps=0", "optim.warmup_fraction=1.5"], "optim.warmup_fraction=1.5 must be in [0, 1]"),
        (["data.max_unk_fraction=2"], "data.max_unk_fraction=2.0 must be in [0, 1]"),
    ],
)
def test_config_errors_are_specific(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", overrides)
    assert message in str(e.value)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", ["optim.lrr=1", "exits.groups=[[1,4]]"])
    assert len(e.value.problems) == 2


def test_world_size_divisibility_is_checked_with_a_hint():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml")  # global 16, micro 4
    validate(cfg, world_size=2)
    with pytest.raises(ConfigError, match=r"micro_batch_size × world_size = 4 × 3"):
        validate(cfg, world_size=3)


def test_warmup_fraction_is_the_same_schedule_and_hash_as_its_steps():
    steps = load_config(CONFIGS / "tiny_cpu.yaml", ["optim.warmup_steps=6"])
    fraction = load_config(CONFIGS / "tiny_cpu.yaml", ["optim.warmup_steps=0", "optim.warmup_fraction=0.2"])
    assert fraction.optim.warmup_for(30) == 6
    assert [learning_rate(t, 30, steps.optim) for t in range(30)] == [
        learning_rate(t, 30, fraction.optim) for t in range(30)
    ]
    assert steps.semantic_hash() == fraction.semantic_hash()
    assert steps.semantic_hash() == load_config(CONFIGS / "tiny_cpu.yaml", ["optim.warmup_steps=6",
                                                "data.max_unk_fraction=0.5"]).semantic_hash()  # fmt: skip


def test_semantic_hash_ignores_cadence_but_not_meaning():
    a = load_config(CONFIGS / "tiny_cpu.yaml")
    assert (
        a.semantic_hash()
        == load_config(
            CONFIGS / "tiny_cpu.yaml", ["checkpoint.interval=7", "train.micro_batch_size=2", "logging.progress=true"]
        ).semantic_hash()
    )
    assert a.semantic_hash() != load_config(CONFIGS / "tiny_cpu.yaml", ["optim.lr=1e-4"]).semantic_hash()
    assert a.semantic_hash() != load_config(CONFIGS / "tiny_cpu.yaml", ["exits.num_groups=1"]).semantic_hash()


# ------------------------------------------------------------------------------------------------ DeepSpeed JSON


def _caps_for(name):
    """The device a shipped JSON is meant for: fp16 files for V100s, CPU for cpu_*, else a bf16 GPU."""
    return V100 if "fp16" in name else CPU if name.startswith("cpu") else A100


@pytest.mark.parametrize("path", sorted(DS.glob("*.json")), ids=lambda p: p.name)
def test_every_ds_config_fills_completely(path):
    cfg = load_config(CONFIGS / "elasticbert_base.yaml")
    raw = load_ds_json(path)
    caps = _caps_for(path.name)
    device = caps.kind
    ds, layout = fill_ds_config(raw, cfg, world_size=64, caps=caps)
    assert "auto" not in json.dumps(ds)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        4096,
        32,
        2,
    )
    assert (layout.micro_batch, layout.grad_accum, layout.world_size) == (32, 2, 64)
    assert ds["optimizer"]["params"]["lr"] == cfg.optim.lr and ds["gradient_clipping"] == cfg.optim.grad_clip
    stage = int(path.name[4]) if path.name.startswith("zero") else 1
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["optimizer"]["params"]["torch_adam"] is True  # torch's AdamW: no op to JIT-build, on CPUs and GPUs
    assert ds["optimizer"]["params"].get("fused") is (True if device == "cuda" else None)  # one kernel on GPUs
    # DeepSpeed's own schemas accept the sections (they forbid unknown keys): the fp16 files are valid even though
    # this CPU cannot run them.
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    DeepSpeedZeroConfig(**ds["zero_optimization"])
    expected = "fp16" if caps is V100 else "bf16" if caps is A100 else "fp32"
    assert DeepSpeedFP16Config(**ds["fp16"]).enabled is (expected == "fp16")
    assert DeepSpeedBF16Config(**ds["bf16"]).enabled is (expected == "bf16")


def test_fp16_refused_on_cpu_with_a_way_out():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml")
    with pytest.raises(ConfigError, match="fp16 is not supported by DeepSpeed on CPU"):
        fill_ds_config(load_ds_json(DS / "zero2_fp16.json"), cfg, world_size=2, caps=CPU)


def test_compile_refused_with_zero3_whichever_file_sets_the_stage():
    """ZeRO-3's parameter-gathering hooks break torch.compile (seen here: a traceback in the first forward)."""
    for json_name, overrides in (("zero3.json", []), ("zero1.json", ["train.zero_stage=3"])):
        cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["train.compile=true", "data.packing=false", *overrides])
        with pytest.raises(ConfigError, match="train.compile=true needs ZeRO stage 0-2"):
            fill_ds_config(load_ds_json(DS / json_name), cfg, world_size=2, caps=A100)
    ok = load_config(CONFIGS / "tiny_cpu.yaml", ["train.compile=true", "data.packing=false", "train.zero_stage=2"])
    ds, _ = fill_ds_config(load_ds_json(DS / "zero3.json"), ok, world_size=2, caps=A100)
    assert ds["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize(
    ("requested", "json_name", "caps", "expected", "why"),
    [
        ("auto", "zero1.json", A100, "bf16", "auto: NVIDIA A100-SXM4-80GB (native bf16"),
        ("auto", "zero1.json", V100, "fp16", "no native bf16, compute capability 7.0): fp16 with dynamic loss scal"),
        ("auto", "zero1.json", CPU, "fp32", "auto: CPU"),
        ("auto", "cpu_fp32.json", CPU, "fp32", "auto: CPU"),
        ("auto", "zero2_bf16.json", A100, "bf16", "the DeepSpeed JSON enables bf16"),
        ("auto", "zero2_fp16.json", A100, "fp16", "the DeepSpeed JSON enables fp16"),
        ("fp32", "zero1.json", A100, "fp32", "train.precision=fp32"),
        ("fp16", "zero3.json", A100, "fp16", "train.precision=fp16"),
        ("bf16", "cpu_fp32.json", CPU, "bf16", "train.precision=bf16"),
        ("fp32", "zero1_fp16.json", V100, "fp32", "train.precision=fp32"),
    ],
)
def test_precision_choice_for_every_device(requested, json_name, caps, expected, why):
    """`train.precision` x DeepSpeed JSON x device (mocked capabilities) -> the DeepSpeed precision sections."""
    from pretrain.precision import FP16_DYNAMIC, choose_precision, precision_of

    cfg = load_config(CONFIGS / "elasticbert_base.yaml", [f"train.precision={requested}"])
    raw = load_ds_json(DS / json_name)
    ds, _ = fill_ds_config(raw, cfg, world_size=64, caps=caps)
    choice = choose_precision(requested, raw, caps)
    assert precision_of(ds) == choice.precision == expected and why in choice.reason
    assert ds["bf16"]["enabled"] is (expected == "bf16") and ds["fp16"]["enabled"] is (expected == "fp16")
    if expected == "fp16":  # dynamic loss scaling: the JSON's settings, DeepSpeed's defaults where it has none
        assert ds["fp16"]["loss_scale"] == 0 and set(FP16_DYNAMIC) <= set(ds["fp16"])
    assert "auto" not in json.dumps(ds)


def test_the_default_job_on_v100s_gets_fp16_without_a_flag():
    """slurm/pretrain_base.sh runs configs/elasticbert_base.yaml with its own ds_config: on V100s that is fp16 with
    dynamic loss scaling (a bf16 JSON would be emulated there), on A100s bf16."""
    cfg = load_config(CONFIGS / "elasticbert_base.yaml")
    raw = load_ds_json(REPO_ROOT / cfg.train.ds_config)
    v100, _ = fill_ds_config(raw, cfg, world_size=64, caps=V100)
    a100, _ = fill_ds_config(raw, cfg, world_size=64, caps=A100)
    assert v100["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                            "hysteresis": 2, "min_loss_scale": 1}  # fmt: skip
    assert v100["bf16"]["enabled"] is False and a100["bf16"]["enabled"] is True and a100["fp16"]["enabled"] is False


def test_bf16_refused_where_it_would_be_emulated():
    cfg = load_config(CONFIGS / "elasticbert_base.yaml")
    with pytest.raises(ConfigError, match=r"bf16 requested \(the DeepSpeed JSON enables bf16\) but Tesla V100"):
        fill_ds_config(load_ds_json(DS / "zero1_bf16.json"), cfg, world_size=64, caps=V100)
    with pytest.raises(ConfigError, match="would only emulate it"):
        fill_ds_config(load_ds_json(DS / "zero1.json"), load_config(CONFIGS / "elasticbert_base.yaml",
                       ["train.precision=bf16"]), world_size=64, caps=V100)  # fmt: skip


def test_device_detection_reads_the_compute_capability(monkeypatch):
    """DeviceCaps.detect: native bf16 from compute capability >= 8 (what torch.cuda.is_bf16_supported(
    including_emulation=False) tests), without creating a CUDA context; no GPU -> CPU."""
    import types

    import torch

    props = {0: types.SimpleNamespace(name="Tesla V100-SXM2-32GB", major=7, minor=0),
             1: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)}  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.version, "hip", None)
    assert DeviceCaps.detect(0) == V100
    assert DeviceCaps.detect(3) == DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", True, "9.0")  # local rank 3 -> GPU 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert DeviceCaps.detect(0) == CPU


def test_ds_json_disagreeing_with_run_config_is_an_error():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml")
    raw = load_ds_json(DS / "cpu_fp32.json")
    raw["train_micro_batch_size_per_gpu"] = 8
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu=8 in the DeepSpeed JSON disagrees"):
        fill_ds_config(raw, cfg, world_size=2)
    raw = load_ds_json(DS / "cpu_fp32.json")
    raw["scheduler"] = {"type": "WarmupLR"}
    with pytest.raises(ConfigError, match="lr schedule lives in the run config"):
        fill_ds_config(raw, cfg, world_size=2)


def test_zero_stage_and_precision_overrides():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["train.zero_stage=3", "train.precision=bf16"])
    ds, layout = fill_ds_config(load_ds_json(DS / "cpu_fp32.json"), cfg, world_size=1, caps=CPU)
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] is True
    assert layout.grad_accum == 4


# ---------------------------------------------------------------------------------------------------- schedule


def test_learning_rate_warmup_then_linear_decay():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["optim.warmup_steps=4", "optim.lr=1.0", "train.train_steps=12"])
    lrs = [learning_rate(t, 12, cfg.optim) for t in range(12)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]  # the first update is not wasted at lr 0
    assert lrs[4] == 1.0 and lrs[8] == pytest.approx(0.5) and lrs[11] == pytest.approx(1 / 8)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))


# -------------------------------------------------------------------------------------------------- launchers


def test_slurm_variables_become_torch_distributed_ones():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "123",
        "SLURM_JOB_NODELIST": "gpu[07-08],gpu11",
    }
    d = resolve_env(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.launcher) == (5, 16, 1, "gpu07", "srun")
    assert d.master_port == resolve_env(dict(env, SLURM_PROCID="0")).master_port  # same on every task
    torchrun = resolve_env(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "h",
            "MASTER_PORT": "1234",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "1",
        }
    )
    assert (torchrun.rank, torchrun.world_size, torchrun.master_port, torchrun.launcher) == (1, 2, 1234, "torchrun")
    # slurm/common.sh exports Slurm's task ids as RANK/WORLD_SIZE: one srun task per rank
    exported = resolve_env(dict(env, RANK="5", WORLD_SIZE="16", LOCAL_RANK="1", MASTER_ADDR="gpu07", MASTER_PORT="9"))
    assert (exported.rank, exported.world_size, exported.master_port, exported.launcher) == (5, 16, 9, "srun")
    alone = resolve_env({})
    assert (alone.rank, alone.world_size, alone.launcher) == (0, 1, "none")


def test_nodelist_expansion():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("n[8-10]-ib") == ["n8-ib", "n9-ib", "n10-ib"]


def test_checkpoint_compatibility_refuses_unless_forced():
    from pretrain.checkpoint import ResumeError, ResumePoint, check_compatible

    old = load_config(CONFIGS / "tiny_cpu.yaml")
    new = load_config(CONFIGS / "tiny_cpu.yaml", ["optim.lr=1e-4", "logging.progress=true"])
    point = ResumePoint(
        "global_step5", {"step": 5, "consumed_samples": 80, "config_hash": old.semantic_hash(), "config": old.to_dict()}
    )
    assert check_compatible(point, old.semantic_hash(), old.to_dict(), force=False) == []
    with pytest.raises(ResumeError, match=r"optim.lr: 0.002 -> 0.0001") as e:
        check_compatible(point, new.semantic_hash(), new.to_dict(), force=False)
    assert "logging.progress" not in str(e.value)  # cadence/logging changes are not the reason
    assert check_compatible(point, new.semantic_hash(), new.to_dict(), force=True) == ["optim.lr: 0.002 -> 0.0001"]


# ------------------------------------------------------------------------------------------- typed choices, cadence


def test_config_error_is_the_common_one():
    from common.errors import ConfigError as Common
    from common.errors import UserError

    assert ConfigError is Common and issubclass(ConfigError, UserError)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.name=adamx", "optim.name='adamx' (did you mean 'adamw'?); expected one of 'adamw', 'lamb'"),
        ("optim.decay=cosin", "optim.decay='cosin' (did you mean 'cosine'?)"),
        ("train.precision=bf61", "train.precision='bf61'"),
        ("train.zero_stage=4", "train.zero_stage=4; expected one of 0, 1, 2, 3"),
        ("train.zero_stage=true", "train.zero_stage=True"),
    ],
)
def test_fixed_choices_are_literal_types_with_a_hint(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", [override])
    assert message in str(e.value)


def test_choice_values_are_normalised():
    cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["train.zero_stage=2.0", "train.precision=bf16"])
    assert cfg.train.zero_stage == 2 and isinstance(cfg.train.zero_stage, int) and cfg.train.precision == "bf16"


def test_a_wrong_type_holds_back_the_checks_of_meaning_but_a_typo_does_not():
    """Type problems leave a field unusable, so `validate` waits; unknown keys and out-of-choice values do not."""
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", ["train.micro_batch_size=many", "exits.groups=[[1,4]]"])
    assert e.value.problems == ["train.micro_batch_size: expected an integer, got 'many'"]
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny_cpu.yaml", ["optim.decay=cosin", "exits.groups=[[1,4]]"])
    assert len(e.value.problems) == 2 and "exits.groups miss layers [2, 3]" in e.value.problems[1]


def test_save_and_eval_are_due_by_step():
    from pretrain.schedule import due

    assert [s for s in range(1, 13) if due(s, 12, 5)] == [5, 10, 12]
    assert [s for s in range(1, 8) if due(s, 7, 0)] == []  # eval.interval 0: never
    cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["train.stop_after_steps=7"])
    assert cfg.train.end_step() == 7 and load_config(CONFIGS / "tiny_cpu.yaml").train.end_step() == 30


def test_user_errors_share_one_base_and_exit_code():
    from common.errors import EXIT_PREEMPTED, UserError
    from common.run_dir import RunDirError
    from pretrain.checkpoint import ResumeError
    from pretrain.preemption import EXIT_PREEMPTED as PREEMPTED

    assert issubclass(ResumeError, UserError) and issubclass(RunDirError, UserError)
    assert PREEMPTED == EXIT_PREEMPTED == 75
