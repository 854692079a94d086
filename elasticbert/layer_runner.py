"""What the early-exit engine runs a model through: one *step* per layer call.

A step is the engine's unit of work: layer `index` (0-based) on a batch of rows, preceded by the embeddings when
`index` is 0 (the rows arrive as token ids) and followed by the exit head on top of the layer when the engine asks for
it (`with_exit`). One call per layer is what the ONNX Runtime runner needs (one session run per layer, the exit fused
in: `finetune.serve.onnx_runtime.OnnxLayers`) and what a CUDA graph captures (`GraphedLayers`).

- `LayerRunner`: the interface, with a generic `step` made of four primitives (`embed`, `run_layer`, `classify`) that
  a runner may implement instead;
- `TorchLayers`: an `ElasticBertForSequenceClassification` in eager torch (fp32 or int8), on any device;
- `GraphedLayers`: `TorchLayers` with each step's shape rounded up to a few buckets and, on a CUDA device, each
  (layer, rows, length) bucket captured once as a CUDA graph and replayed (one launch per layer call instead of a
  few dozen). Elsewhere the same buckets run eagerly: the CPU tests exercise everything but the capture.

Step cost: on a CPU a step's time follows its rows x padded length plus a fixed cost per call, and grows faster than
its tokens past a few hundred of them (the activations leave the caches), so a batch of rows of mixed lengths runs
faster as a few steps of rows of similar length than as one padded step. A CPU runner says so with its `step_cost`
(`StepCost`) and the engine splits its layer calls accordingly (`elasticbert.exit_queues.length_groups`); a GPU
runner has none: there a step of 4 rows costs what one of 32 does, and `GraphedLayers` replays fixed shapes.

Masks: `mask` is the [B, T] 1/0 padding mask (right padding) on the runner's device; `padded` says whether any row is
shorter than T. The engine knows it from the rows' lengths (kept on the host), so no runner needs to ask the device
(`mask.all()` on a GPU is a host sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

EmbeddingInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # input_ids, token_type_ids, position_ids


@dataclass(frozen=True)
class StepCost:
    """A CPU runner's step time, in tokens' worth: `call_tokens` per step (session run, kernel launches, Python)
    plus one per row x padded length, up to `max_tokens` per step, past which a step runs slower per token (measured
    per runner, one thread; see each runner's constant)."""

    call_tokens: float
    max_tokens: int


# Eager torch on a CPU (one thread, MiniLM-size layers; bench/serving/serving_steps.py, docs/results/serving_steps/): a
# step costs ~0.8 ms of Python and dispatch besides ~27 us per token in fp32, ~14 in dynamic int8 (31 and 54 tokens'
# worth); the SST-2 stream at batch 32 is fastest at 14-56 (1.39x / 1.35x one step per call); past ~512 tokens a step
# slows.
EAGER_CPU_STEP = StepCost(call_tokens=32, max_tokens=512)


@dataclass
class StepOutput:
    """What a step returns: the layer's hidden states [B, T, d] and, when the exit ran, its representation and
    logits [B, K]. All on the runner's device."""

    hidden: torch.Tensor
    representation: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class LayerRunner:
    """What the engine runs a model through. Hidden states and logits are torch tensors on the runner's `device`
    whatever computes them, so that the rules and the bookkeeping are the same code for every runner."""

    config: Any
    exit_layers: tuple[int, ...]
    device: torch.device
    training = False
    step_cost: StepCost | None = None  # None: run every layer call as one step (a GPU: full batches)

    def step(
        self, index: int, inputs: torch.Tensor | EmbeddingInputs, mask: torch.Tensor, padded: bool, with_exit: bool
    ) -> StepOutput:
        """Layer `index` on `inputs` (hidden states [B, T, d], or at index 0 the embedding inputs), then exit
        `index + 1` when `with_exit`. The generic version composes the primitives below."""
        hidden = self.embed(*inputs) if index == 0 else inputs
        hidden = self.run_layer(index, hidden, mask[:, None, None, :].bool() if padded else None)
        if not with_exit:
            return StepOutput(hidden)
        representation, logits = self.classify(index + 1, hidden, mask if padded else None)
        return StepOutput(hidden, representation, logits)

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def run_layer(self, index: int, hidden: torch.Tensor, sdpa_mask: torch.Tensor | None) -> torch.Tensor:
        """Layer `index` with a [B, 1, 1, T] boolean mask (True: attend), None when nothing is padded."""
        raise NotImplementedError

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(representation, logits) of exit `layer` (1-based); `attention_mask` None: no padding."""
        raise NotImplementedError


def eager_step_cost(device: torch.device) -> StepCost | None:
    """The step cost of the eager modules on `device`: the CPU's; none on a GPU (one step per call). Every eager
    runner (`TorchLayers`, the HashEE model, its own runner) asks here."""
    return TorchLayers.step_costs.get(device.type)


class TorchLayers(LayerRunner):
    """The eager runner: the model's own modules."""

    step_costs: dict[str, StepCost] = {"cpu": EAGER_CPU_STEP}  # by device type; none on a GPU: one step per call

    def __init__(self, model: nn.Module) -> None:
        self.model, self.config, self.exit_layers = model, model.config, tuple(model.exit_layers)
        self.device, self.training = model.device, model.training
        self.step_cost = eager_step_cost(self.device)

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        return self.model.elasticbert.embeddings(input_ids, token_type_ids, position_ids)

    def run_layer(self, index: int, hidden: torch.Tensor, sdpa_mask: torch.Tensor | None) -> torch.Tensor:
        return self.model.elasticbert.encoder.run_layer(index, hidden, sdpa_mask)

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.classify(layer, hidden, attention_mask)


def bucket(value: int, step: int, cap: int | None = None) -> int:
    """`value` rounded up to a multiple of `step` (at most `cap`, when given and >= value)."""
    rounded = -(-value // step) * step
    return rounded if cap is None or cap < value else min(rounded, cap)


def row_bucket(rows: int) -> int:
    """Rows rounded up to a power of two: a few shapes serve every partial batch."""
    return 1 << max(rows - 1, 0).bit_length()


class GraphedLayers(TorchLayers):
    """`TorchLayers` whose steps run at a few fixed shapes: rows rounded up to a power of two, length up to a
    multiple of `length_step` (the model's position limit caps it). The extra rows are one-token dummies and the
    extra columns padding; the mask keeps both out of every real row (attention per row), so each real row's result
    is the unpadded one (fp32: within float rounding, tested).

    Why: on a GPU a layer call of a small batch is a few dozen kernel launches that take longer than their arithmetic,
    and a CUDA graph replays them as one. Each (layer, exit or not, rows, length) shape is captured the first time it
    runs (`torch.cuda.graph`, one memory pool for all) and replayed after; its inputs are copied into the graph's
    static buffers and its outputs copied out (the next replay overwrites them). Off CUDA (`capture` False) the same
    static buffers run eagerly: the shape and mask logic is what the CPU tests check. int8 (torch's dynamic
    quantization) runs on the CPU only and is not captured.
    """

    step_costs: dict[str, StepCost] = {}  # its point is a few fixed shapes of full batches, on any device

    def __init__(self, model: nn.Module, length_step: int = 16, capture: bool | None = None) -> None:
        super().__init__(model)
        self.length_step = length_step
        self.max_length = int(getattr(model.config, "max_position_embeddings", 512))
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {self.device}")
        self.shapes: dict[tuple, _StaticStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None

    def step(
        self, index: int, inputs: torch.Tensor | EmbeddingInputs, mask: torch.Tensor, padded: bool, with_exit: bool
    ) -> StepOutput:
        rows, length = mask.shape
        positions = index == 0 and inputs[2] is not None
        shape = (index, with_exit, row_bucket(rows), bucket(length, self.length_step, self.max_length), positions)
        static = self.shapes.get(shape)
        if static is None:
            static = self.shapes[shape] = _StaticStep(self, *shape[:4], like=inputs)
        return static.run(inputs, mask)


class _StaticStep:
    """One fixed-shape step of a `GraphedLayers`: its input buffers, and its CUDA graph once captured."""

    def __init__(self, owner: GraphedLayers, index: int, with_exit: bool, rows: int, length: int, like: Any) -> None:
        self.owner, self.index, self.with_exit = owner, index, with_exit
        device = (like[0] if index == 0 else like).device  # beside the inputs it copies (the runner's device)
        self.mask = torch.zeros(rows, length, dtype=torch.long, device=device)
        if index == 0:
            ids, types, positions = like
            self.inputs: Any = (
                torch.zeros(rows, length, dtype=ids.dtype, device=device),
                torch.zeros(rows, length, dtype=ids.dtype, device=device),
                None if positions is None else torch.zeros(rows, length, dtype=positions.dtype, device=device),
            )
        else:
            self.inputs = torch.zeros(rows, length, like.shape[-1], dtype=like.dtype, device=device)
        self.graph: Any = None
        self.outputs: StepOutput | None = None

    def _forward(self) -> StepOutput:
        return LayerRunner.step(self.owner, self.index, self.inputs, self.mask, True, self.with_exit)

    def _load(self, inputs: Any, mask: torch.Tensor) -> None:
        rows, length = mask.shape
        self.mask.zero_()
        self.mask[:rows, :length].copy_(mask)
        self.mask[rows:, 0] = 1  # dummy rows: one token each, so that no row's attention is empty
        if self.index == 0:
            for buffer, value in zip(self.inputs, inputs):
                if buffer is not None:
                    buffer[:rows, :length].copy_(value)
        else:
            self.inputs[:rows, :length].copy_(inputs)

    def run(self, inputs: Any, mask: torch.Tensor) -> StepOutput:
        rows, length = mask.shape
        self._load(inputs, mask)
        if not self.owner.capture:
            out = self._forward()
        else:
            if self.graph is None:
                self._capture()
            self.graph.replay()
            out = self.outputs
        cut = StepOutput(out.hidden[:rows, :length].clone())
        if out.logits is not None:
            cut.representation, cut.logits = out.representation[:rows].clone(), out.logits[:rows].clone()
        return cut

    def _capture(self) -> None:  # a CUDA device (bench/gpu/gpu_bench.py; CI: tests/support/fake_cuda.py's stubs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph (lazy initialisations, kernel selection)
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.owner.pool):
            self.outputs = self._forward()


def as_runner(model: nn.Module | LayerRunner) -> LayerRunner:
    """The runner of a model: itself when it is one, else its eager `TorchLayers` (a one-off call: `run_batch`, the
    model's forward)."""
    return model if isinstance(model, LayerRunner) else TorchLayers(model)


def serving_runner(model: nn.Module | LayerRunner, cuda_graphs: bool = True) -> LayerRunner:
    """The runner a long-lived engine (a serving classifier) keeps: `GraphedLayers` for an eval-mode model on a CUDA
    device (when `cuda_graphs`: its graphs are captured once and replayed for every later call of that shape),
    else `as_runner`'s."""
    if not isinstance(model, LayerRunner) and cuda_graphs and model.device.type == "cuda" and not model.training:
        return GraphedLayers(model)
    return as_runner(model)


__all__ = [
    "GraphedLayers",
    "LayerRunner",
    "StepCost",
    "StepOutput",
    "TorchLayers",
    "as_runner",
    "bucket",
    "row_bucket",
    "serving_runner",
]
