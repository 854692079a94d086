"""The masked-LM loss of every active exit through the shared decoder, as one autograd node.

With k exits and M masked tokens, the decoder (tied word embeddings, V rows) is the step's largest piece of work.
Written as k separate `linear -> cross_entropy` calls, autograd runs k weight-gradient products of [V, M] x [M, H],
each adding into the [V, H] gradient (a read and a write of it per exit), k input-gradient products, and a copy of
the bias into every [M, V] logits block; at hidden 256 that was 455 of a 950 ms CPU step. Here:
- the forward works exit by exit (an [M, V] block at a time stays in cache: one [k·M, V] product ran 1.35x
  slower); the bias rides in the product as one more input column (no bias copy into the block, no second read of
  it), and one fused `log_softmax` per block writes the log-probabilities, all the backward needs;
- the backward exponentiates them in place into the softmax, subtracts the one-hot targets, and runs the two
  products once, on all k·M rows, with each exit's upstream scale applied to the small operands and results
  instead of to the [k·M, V] matrix (the bias gradient is one matrix-vector product);
- on CPU, the [k·M, V] buffer is kept for the next step (`_CpuSpares`).
The numbers are those of `F.cross_entropy` per exit (`tests/elasticbert/test_masked_lm.py`); what each of these
saved is in docs/figures.md.
"""

from __future__ import annotations

import torch


class _CpuSpares:
    """The previous step's large buffers, kept for the next step on CPU. A fresh [k·M, V] buffer (hundreds of MB)
    comes from the OS as new zeroed pages at every step (40 of a 1,000 ms step at hidden 256); CUDA's caching
    allocator already reuses its blocks, so on GPUs this keeps nothing. A buffer comes back only once its backward
    has consumed it (or at once without one), so no live graph shares it."""

    def __init__(self) -> None:
        self._kept: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        numel = shape[0] * shape[1]
        kept = self._kept.pop(name, None)
        if kept is None or kept.device != device or kept.dtype != dtype or kept.numel() < numel:
            # an eighth spare: the masked-token count varies from batch to batch
            kept = torch.empty(numel + numel // 8, device=device, dtype=dtype)
        return kept[:numel].view(shape)

    def give_back(self, **buffers: torch.Tensor) -> None:
        for name, buffer in buffers.items():
            if buffer.device.type == "cpu":
                self._kept[name] = buffer._base if buffer._base is not None else buffer


_spares = _CpuSpares()


class _ExitsMaskedLMLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        rows: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        num_exits: int,
        keep_for_backward: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, device = targets.shape[0], rows.device.type
        # the product in autocast's dtype when autocast is on (as F.linear would run), else in the rows' dtype
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype
        wide_dtype = torch.promote_types(dtype, torch.float32)  # softmax in at least fp32
        # the bias as one more input column: the product writes the logits with it (no bias copy into every block)
        rows_one = torch.cat([rows.to(dtype), rows.new_ones((rows.shape[0], 1), dtype=dtype)], dim=1)
        weight_bias = _spares.take("weight_bias", (weight.shape[0], weight.shape[1] + 1), rows.device, dtype)
        torch.cat([weight.to(dtype), bias.to(dtype)[:, None]], dim=1, out=weight_bias)
        log_probs = _spares.take("log_probs", (num_exits * m, weight.shape[0]), rows.device, wide_dtype)
        logits = _spares.take("logits", (m, weight.shape[0]), rows.device, dtype)  # one exit's at a time
        losses, hits = [], []
        for i in range(num_exits):
            block = log_probs[i * m : (i + 1) * m]
            with torch.autocast(device, enabled=False):
                torch.mm(rows_one[i * m : (i + 1) * m], weight_bias.t(), out=logits)
            picked = logits.gather(1, targets[:, None]).squeeze(1)
            hits.append((picked >= logits.amax(dim=-1)).float().mean())  # the target is a top logit (ties count)
            torch.log_softmax(logits, dim=-1, dtype=wide_dtype, out=block)
            losses.append(-block.gather(1, targets[:, None]).mean())
        _spares.give_back(logits=logits)
        if keep_for_backward:
            ctx.save_for_backward(rows_one, weight_bias, log_probs, targets)
        else:
            _spares.give_back(weight_bias=weight_bias, log_probs=log_probs)
        ctx.num_exits, ctx.dtypes, ctx.used = num_exits, (rows.dtype, weight.dtype, bias.dtype), False
        accuracy = torch.stack(hits)
        ctx.mark_non_differentiable(accuracy)
        return torch.stack(losses), accuracy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor, _grad_accuracy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        if ctx.used:  # the saved log-probabilities were overwritten by the first backward
            raise RuntimeError("the multi-exit masked-LM loss supports one backward pass (no retain_graph)")
        ctx.used = True
        rows_one, weight_bias, log_probs, targets = ctx.saved_tensors
        k, m, hidden = ctx.num_exits, targets.shape[0], rows_one.shape[1] - 1
        rows_dtype, weight_dtype, bias_dtype = ctx.dtypes
        # d loss_i / d logits = (softmax - one_hot(target)) * grad_i / M: the softmax in place, and the per-row
        # scale applied to the products' small operands and results instead of to the [k·M, V] matrix
        scale = (grad_loss.to(log_probs.dtype) / m).repeat_interleave(m)  # [k·M]
        grad = log_probs.exp_()
        grad[torch.arange(k * m, device=grad.device), targets.repeat(k)] -= 1
        grad_bias = (scale @ grad).to(bias_dtype)
        grad = grad.to(rows_one.dtype)
        grad_rows = ((grad @ weight_bias[:, :hidden]) * scale[:, None]).to(rows_dtype)
        grad_weight = (grad.t() @ (rows_one[:, :hidden] * scale[:, None]).to(grad.dtype)).to(weight_dtype)
        _spares.give_back(weight_bias=weight_bias, log_probs=log_probs)  # the step's large buffers, for the next step
        return grad_rows, grad_weight, grad_bias, None, None, None


@torch.compiler.disable  # measured: inductor's CPU code for it ran 1.15x slower than these eager kernels
def exits_masked_lm_loss(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor, num_exits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-exit mean cross-entropy [k] and accuracy [k] of `rows` [k·M, H] (exit-major: the transformed hidden
    states of each exit at the M masked positions) against `targets` [M], logits = rows @ weight.T + bias."""
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (rows, weight, bias))
    return _ExitsMaskedLMLoss.apply(rows, weight, bias, targets, num_exits, keep)
