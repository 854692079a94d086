"""DeepSpeed checkpoint (ZeRO 0/1/2/3, any world size) -> a Hugging Face directory finetune and AutoModel load.

Weights come from DeepSpeed's own consolidation (`zero_to_fp32`: the fp32 master copy in the optimizer partitions,
so a bf16 run exports its fp32 weights); ZeRO-0 checkpoints have no partitions and use the module state. The
checkpoint's checksums are verified first (`--no-verify-checksums` skips them; truncated files are refused anyway),
and weights holding NaN/inf are refused. The result is written to a temporary sibling directory and renamed
(`common.io.atomic_path`), so a failed export leaves no half-written model; a failed write (a full disk, a read-only
output) is one line naming the file, exit 4.

Layouts: "ours" (`save_pretrained`: model.safetensors with the MLM/SOP heads, what finetune and AutoModel load) or
"fnlp" (`elasticbert.fnlp_export`: the shape of the released `fnlp/elasticbert-base` for the official ElasticBERT
code, the encoder and every pooler under `elasticbert.`, no heads, as pytorch_model.bin and model.safetensors).
"""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import torch

from common.errors import describe_os_error
from common.integrity import IntegrityError, seal
from common.io import atomic_path, make_dirs, removed_on_failure
from common.outputs import MODEL_DIRECTORY, Output, check_output
from common.run_dir import RunWriteError
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining  # (importing elasticbert registers Auto*)
from elasticbert.fnlp_export import plan_fnlp, save_fnlp
from elasticbert.verification import verified_load

from .checkpoint import CLIENT_STATE, ResumeError, read_client_state, resolve_tag, verify_checkpoint
from .integrity import LOAD_ERRORS, nonfinite_tensors


def consolidated_state_dict(ckpt_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights of the whole model from a DeepSpeed checkpoint tag directory (our own, verified files: DeepSpeed
    pickles its states, so they are loaded with weights_only=False, as DeepSpeed itself does)."""
    tag_dir = ckpt_dir / tag
    try:
        if glob.glob(str(tag_dir / "*optim_states.pt")):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
        model_files = sorted(glob.glob(str(tag_dir / "mp_rank_*_model_states.pt")))
        if not model_files:
            raise ResumeError(f"{tag_dir}: no DeepSpeed model or optimizer states")
        state = torch.load(model_files[0], map_location="cpu", weights_only=False)
        return {k: v.float() for k, v in state["module"].items()}
    except LOAD_ERRORS as e:
        raise ResumeError(f"DeepSpeed could not consolidate {tag_dir}: {type(e).__name__}: {str(e)[:500]}") from None


LAYOUTS = ("ours", "fnlp")
INFO = "pretrain_info.json"  # what marks a directory `export` wrote (its tag, step, config hash)
EXPORT = Output(
    "pretrain export",
    "a pre-trained model exported by pretrain export",
    folder=True,
    whole=True,
    own=lambda path: (path / INFO).is_file(),
    accepts=(MODEL_DIRECTORY,),
)


def export(
    ckpt_dir: Path, tag: str | None, output: Path, overwrite: bool = False, verify: bool = True, layout: str = "ours"
) -> Path:
    """Write `output` (weights + config + tokenizer files, in `layout`); returns it. Refuses an `output` inside the
    checkpoints or holding them, or that is not empty and not an earlier export (`common.outputs`; one is replaced
    only with `overwrite`), a checkpoint that fails its checksums unless not `verify`, non-finite
    weights always, and (layout "fnlp") a model the official layout cannot express."""
    if layout not in LAYOUTS:
        raise ResumeError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise ResumeError(f"{ckpt_dir} is not a directory (expected RUN/checkpoints)")
    tag = resolve_tag(ckpt_dir, tag)
    export_files = ckpt_dir / tag / "export"
    if not (export_files / "config.json").is_file():
        raise ResumeError(f"{export_files / 'config.json'} is missing: not a checkpoint written by pretrain")
    output = check_output(output, EXPORT, [("--checkpoint", ckpt_dir)], overwrite)

    verify_checkpoint(ckpt_dir, tag, verify, what="export")
    try:  # export/ was verified with the checkpoint (its checksums.json covers the tag): no second check, no note
        with verified_load():
            config = ElasticBertConfig.from_pretrained(str(export_files))
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ResumeError(f"{export_files / 'config.json'} is not a readable model config: {e}") from None
    if layout == "fnlp":  # refused before the weights are consolidated
        plan_fnlp(config, classifier=False, where=str(ckpt_dir / tag))
    state = consolidated_state_dict(ckpt_dir, tag)
    count, names = nonfinite_tensors(state)
    if count:
        raise IntegrityError(
            f"refusing to export {ckpt_dir / tag}: {count} weight tensor(s) hold NaN/inf (e.g. {', '.join(names)}); "
            "export an older checkpoint (--tag global_stepN)"
        )
    model = ElasticBertForPreTraining(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"cls.predictions.decoder.weight"}
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ResumeError(
            f"{ckpt_dir / tag}: weights do not match the saved config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    info = read_client_state(ckpt_dir, tag) if (ckpt_dir / tag / CLIENT_STATE).is_file() else {}
    try:
        _write_export(model, output, layout, ckpt_dir / tag, export_files / "tokenizer", info)
    except OSError as err:  # a full disk, a read-only output: one line naming the file (exit 4), nothing kept
        raise RunWriteError(f"{output}: cannot write the export ({describe_os_error(err)}); nothing was kept") from err
    return output


def _write_export(
    model: ElasticBertForPreTraining, output: Path, layout: str, tag_dir: Path, tokenizer: Path, info: dict
) -> None:
    """The export directory, written beside `output` and renamed when complete (`common.io.atomic_path`: a failed
    write, torch's or safetensors' included, is an OSError naming the file); folders made for it go on failure."""
    with removed_on_failure(output.parent) as parent:
        make_dirs(parent)
        with atomic_path(output) as tmp:
            if layout == "fnlp":
                save_fnlp(model, tmp, str(tag_dir))
            else:
                model.save_pretrained(str(tmp), safe_serialization=True)
            if tokenizer.is_dir():
                for f in tokenizer.iterdir():
                    if f.is_file() and not (tmp / f.name).exists():
                        shutil.copy2(f, tmp / f.name)
            fields = {"tag": tag_dir.name, **{k: info.get(k) for k in ("step", "consumed_samples", "config_hash")}}
            (tmp / INFO).write_text(json.dumps(fields, indent=2))
            seal(tmp)  # checked whenever the export is loaded
