"""Inference precision: fp32, or int8 on the CPU: the encoder's linear layers with int8 weights (per output channel)
and int8 activations quantized per call with one scale per token.

Why per token: torch's dynamic quantization (`quantize_dynamic`, what this module used before) scales each
activation tensor by its own range, over the whole batch, so an input's int8 values - and its logits, its exit, even
its label - depended on the inputs batched with it and on the padding: of 400 held-out SST-2 sentences 14 changed
label between batch 1 and batch 32 (66 exit layers). With one scale per token (row), a token's int8 values are the
same alone or in any batch, as in the ONNX Runtime steps (`finetune.serve.onnx_export.per_token_int8`): the integer
product is exact and every float step after it is per element, so a row's answer does not depend on its batch.

How, in eager torch: each token is divided by its own max |x| (its values then span [-1, 1]) and quantized with one
fixed scale by fbgemm's int8 GEMM (`quantized::linear_with_input_q_dq_qweight_dq_output_fp32`, the x86 and fbgemm
engines), whose fp32 result is multiplied back by the token's max: the same fused kernel and packed weights
`quantize_dynamic` uses, with the scale chosen per token instead of per call. Activations use 7 bits (0..127, zero
point 64), as torch's dynamic quantization does on these engines: a CPU without VNNI adds pairs of int8 products in
16 bits, where 8-bit activations could saturate. Query, key and value read one input: one product of their three
weights side by side (`PerTokenInt8Linear.fused`), split after. On another engine (ARM's qnnpack, onednn), the
product is `torch._int_mm` on symmetric 8-bit tokens - the same per-token rule, slower at large batches. Cost
against `quantize_dynamic` (bench/int8_eager_per_token.py, docs/reliability_vi_data.md): see the figures there.

Per-channel weight scales, because BERT's FFN output projections have outlier weights (max/std ≈ 175 in MiniLM's
first layer): with one scale per tensor, a fine-tuned SST-2 model lost up to 2.2 points at its exits; per channel,
every exit is within 0.2 of fp32. The exit heads stay fp32: they are ~1 % of the FLOPs and they are where the exit
decisions are made. Embeddings, LayerNorm, attention's softmax stay fp32 as well.

    from elasticbert import ElasticBertForSequenceClassification, for_inference
    model = for_inference(ElasticBertForSequenceClassification.from_pretrained("runs/sst2/best"), "int8")

Early-exit thresholds are calibrated on logits; chosen at one precision they are only approximately right at the
other, so a sweep records its precision (`finetune early-exit --precision int8`) and so does `save-early-exit`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from common.errors import ConfigError
from common.torch_private import int8_matmul

from .backbone import ElasticBertSelfAttention
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
            return f"precision int8 (per-token int8 kernels) runs on the CPU only, not on {device}: pass --device cpu"
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
    for layer in quantized.elasticbert.encoder.layer:  # the encoder only: the exit heads stay fp32
        quantize_layer(layer)
    quantized.inference_precision = "int8"
    return quantized


def quantize_layer(layer: nn.Module) -> None:
    """One encoder layer's linear layers in per-token int8, in place: query, key and value as one product."""
    attention = layer.attention.self
    attention.qkv = PerTokenInt8Linear.fused([attention.query, attention.key, attention.value])
    del attention.query, attention.key, attention.value
    attention.__class__ = Int8SelfAttention
    for parent, name in ((layer.attention.output, "dense"), (layer.intermediate, "dense"), (layer.output, "dense")):
        setattr(parent, name, PerTokenInt8Linear.fused([getattr(parent, name)]))


class Int8SelfAttention(ElasticBertSelfAttention):
    """Self-attention whose query, key and value come from one per-token int8 product (`qkv`), split after."""

    def forward(self, hidden: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (self._heads(part) for part in self.qkv(hidden).chunk(3, dim=-1))
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        b, _, t, _ = context.shape
        return context.transpose(1, 2).reshape(b, t, -1)


# fbgemm's activations: a token divided by its max |x| spans [-1, 1] -> uint8 0..127 (7 bits, zero point 64)
_INPUT_SCALE, _INPUT_ZERO_POINT = 1.0 / 63, 64
_FBGEMM_ENGINES = ("x86", "fbgemm")


class PerTokenInt8Linear(nn.Module):
    """`x @ W.T + b` with `W` in int8 (symmetric, one scale per output channel) and `x` quantized per call with one
    scale per token (row of the last axis): a row's result does not depend on the other rows of the call. See the
    module docstring for the kernels."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scale = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.fbgemm = torch.backends.quantized.engine in _FBGEMM_ENGINES
        if self.fbgemm:
            zero = torch.zeros(len(scale), dtype=torch.long)
            qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
            self.packed = torch.ao.nn.quantized.modules.linear.LinearPackedParams(dtype=torch.qint8)
            self.packed.set_weight_bias(qweight, None)
        else:
            self.register_buffer("weight_t", torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous())
            self.register_buffer("weight_scale", scale / 127)  # the token's 127 levels, folded in

    @classmethod
    def fused(cls, linears: list[nn.Linear]) -> PerTokenInt8Linear:
        """One product of `linears` (which read the same input), their outputs side by side."""
        weight = torch.cat([m.weight for m in linears])
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
        return cls(weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        peak = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)  # each token's own scale
        if self.fbgemm:
            out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                rows / peak, _INPUT_SCALE, _INPUT_ZERO_POINT, self.packed._packed_params
            )
            scale = peak
        else:
            tokens = torch.round(rows * (127 / peak)).to(torch.int8)
            out = int8_matmul(tokens, self.weight_t).float()
            scale = peak * self.weight_scale
        # in place: a fresh output of a few MB costs more to allocate than to scale
        out = out.mul_(scale) if self.bias is None else torch.addcmul(self.bias, out, scale, out=out)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kernel = "fbgemm" if self.fbgemm else "_int_mm"
        return f"in_features={self.in_features}, out_features={self.out_features}, per-token int8 ({kernel})"


__all__ = [
    "PRECISIONS",
    "PerTokenInt8Linear",
    "Precision",
    "for_inference",
    "model_precision",
    "precision_problem",
    "quantized_engine",
]
