"""The masked-LM loss of every active exit through the shared decoder, as one autograd node.

With k exits and M masked tokens, the decoder (tied word embeddings, V rows) is the step's largest piece of work.
Written as k separate `linear -> cross_entropy` calls, autograd runs k weight-gradient products of [V, M] x [M, H],
each adding into the [V, H] gradient (a read and a write of it per exit), k input-gradient products, and a copy of
the bias into every [M, V] logits block; at hidden 256 that was 455 of a 950 ms CPU step. Here the forward still
works exit by exit (an [M, V] block at a time stays in cache: one [k·M, V] product ran 1.35x slower), and keeps only
the logits and their log-sum-exp; the backward turns them in place into d loss / d logits and runs the two products
once, on all k·M rows. The numbers are those of `F.cross_entropy` per exit (`tests/elasticbert/test_masked_lm.py`).
"""

from __future__ import annotations

import torch


class _ExitsMaskedLMLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        rows: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        num_exits: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, device = targets.shape[0], rows.device.type
        # the product in autocast's dtype when autocast is on (as F.linear would run), else in the rows' dtype
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype
        r, w, b = rows.to(dtype), weight.to(dtype), bias.to(dtype)
        wide_dtype = torch.promote_types(dtype, torch.float32)  # softmax in at least fp32
        logits = r.new_empty((num_exits * m, weight.shape[0]))
        log_norm = torch.empty(num_exits * m, device=rows.device, dtype=wide_dtype)
        losses, hits = [], []
        for i in range(num_exits):
            block = logits[i * m : (i + 1) * m]
            with torch.autocast(device, enabled=False):
                torch.addmm(b, r[i * m : (i + 1) * m], w.t(), out=block)
            wide = block.to(wide_dtype)
            lse = torch.logsumexp(wide, dim=-1)
            log_norm[i * m : (i + 1) * m] = lse
            picked = wide.gather(1, targets[:, None]).squeeze(1)
            losses.append((lse - picked).mean())
            hits.append((picked >= wide.amax(dim=-1)).float().mean())  # the target is a top logit (ties count)
        ctx.save_for_backward(r, w, logits, log_norm, targets)
        ctx.num_exits, ctx.dtypes, ctx.used = num_exits, (rows.dtype, weight.dtype, bias.dtype), False
        accuracy = torch.stack(hits)
        ctx.mark_non_differentiable(accuracy)
        return torch.stack(losses), accuracy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor, _grad_accuracy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        if ctx.used:  # the saved logits were overwritten by the first backward
            raise RuntimeError("the multi-exit masked-LM loss supports one backward pass (no retain_graph)")
        ctx.used = True
        r, w, logits, log_norm, targets = ctx.saved_tensors
        k, m = ctx.num_exits, targets.shape[0]
        rows_dtype, weight_dtype, bias_dtype = ctx.dtypes
        # d loss_i / d logits = (softmax - one_hot(target)) * grad_i / M, in at least fp32
        scale = (grad_loss.to(log_norm.dtype) / m).repeat_interleave(m)[:, None]  # [k·M, 1]
        grad = logits.to(log_norm.dtype).sub_(log_norm[:, None]).exp_().mul_(scale)  # in place when fp32
        grad[torch.arange(k * m, device=grad.device), targets.repeat(k)] -= scale[:, 0]
        grad_bias = grad.sum(dim=0).to(bias_dtype)
        grad = grad.to(r.dtype)
        grad_rows = (grad @ w).to(rows_dtype)
        grad_weight = (grad.t() @ r).to(weight_dtype)
        return grad_rows, grad_weight, grad_bias, None, None


@torch.compiler.disable  # measured: inductor's CPU code for it ran 1.15x slower than these eager kernels
def exits_masked_lm_loss(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor, num_exits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-exit mean cross-entropy [k] and accuracy [k] of `rows` [k·M, H] (exit-major: the transformed hidden
    states of each exit at the M masked positions) against `targets` [M], logits = rows @ weight.T + bias."""
    return _ExitsMaskedLMLoss.apply(rows, weight, bias, targets, num_exits)
