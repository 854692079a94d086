"""Inference precision: fp32, or int8 dynamic quantization of the linear layers on the CPU.

Why torch's own dynamic quantization (`torch.ao.quantization.quantize_dynamic`): it replaces each `nn.Linear` of the
encoder's layers by an int8 kernel (weights quantized once, per output channel; activations per call) and leaves
every module's interface
as it was, so the early-exit engine runs an int8 model unchanged — the same rules, samples leaving the batch,
per-layer calls. Measured on this project's CPU (bench/serving.py, MiniLM): the int8 encoder is ~1.9x the fp32 one
at batch 1 and 32 with one thread. The exit heads stay fp32: they are ~1 % of the FLOPs and they are where the exit
decisions are made. Embeddings, LayerNorm and softmax stay fp32 as well. Per-channel weight scales, because BERT's
FFN output projections have outlier weights (max/std ≈ 175 in MiniLM's first layer): with one scale per tensor, a
fine-tuned SST-2 model lost up to 2.2 points at its exits; per channel, every exit is within 0.2 of fp32.

Dynamic quantization scales each activation tensor by its own range, so a sample's int8 logits depend slightly on
the batch it runs in (at batch 1 they are exactly the per-layer computation; see tests/finetune_early_exit).

    from elasticbert import ElasticBertForSequenceClassification, for_inference
    model = for_inference(ElasticBertForSequenceClassification.from_pretrained("runs/sst2/best"), "int8")

Early-exit thresholds are calibrated on logits; chosen at one precision they are only approximately right at the
other, so a sweep records its precision (`finetune early-exit --precision int8`) and so does `save-early-exit`.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.ao.quantization import per_channel_dynamic_qconfig

from common.errors import ConfigError

from .exit_setting import PRECISIONS, Precision

PREFERRED_ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")  # torch's int8 CPU back ends, best first


def quantized_engine() -> str | None:
    """The int8 back end this torch build offers on this CPU, or None."""
    supported = torch.backends.quantized.supported_engines
    return next((engine for engine in PREFERRED_ENGINES if engine in supported), None)


def precision_problem(precision: str, device: torch.device | str = "cpu") -> str | None:
    """Why `precision` cannot run on `device` with this torch build (None: it can)."""
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})"
    if precision == "int8":
        if torch.device(device).type != "cpu":
            return f"precision int8 (dynamic quantization) runs on the CPU only, not on {device}: pass --device cpu"
        if quantized_engine() is None:
            return (
                "precision int8: this torch build has no quantized CPU engine "
                f"(torch.backends.quantized.supported_engines = {torch.backends.quantized.supported_engines})"
            )
    return None


def model_precision(model: nn.Module) -> str:
    """ "int8" when the model's linear layers are dynamically quantized, else "fp32"."""
    return getattr(model, "inference_precision", "fp32")


def for_inference(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """The model in eval mode at `precision`: itself for fp32, an int8 copy for int8 (the argument is left as it
    was). Refuses a precision this machine cannot run, with the reason."""
    current = model_precision(model)
    if precision == current:
        return model.eval()
    device = next(model.parameters()).device
    if problem := precision_problem(precision, device):
        raise ConfigError(problem)
    if current != "fp32":
        raise ConfigError(f"the model is already quantized to {current}; load it again for {precision}")
    torch.backends.quantized.engine = quantized_engine()
    quantized = copy.deepcopy(model).eval()
    layers = quantized.elasticbert.encoder.layer  # the encoder only: the exit heads stay fp32
    with warnings.catch_warnings():  # torch flags its eager quantization API as deprecated; it is what runs fastest
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(layers, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    quantized.inference_precision = "int8"
    return quantized


__all__ = ["PRECISIONS", "Precision", "for_inference", "model_precision", "precision_problem", "quantized_engine"]
