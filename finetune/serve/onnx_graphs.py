"""Graph surgery for the ONNX export (`onnx_export`): joining the traced pieces into one graph per layer call.

The export traces the embeddings, each layer and each exit head apart (each is one torch module; a layer's int8
version is its fp32 graph rewritten, `onnx_export.per_token_int8`, which must not touch the fp32 embeddings and exit
heads) and joins them here into one *step* per layer: [embeddings →] layer → [exit], so that ONNX Runtime runs one
session per layer call (`onnx_runtime.OnnxLayers`). Standard `onnx` protobuf editing only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ORT_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib operators (the int8 steps' MatMulIntegerToFloat)
EXIT_ROWS = "exit_rows"  # a step's input: how many of its rows the fused exit head runs on (all, or none)


def rename_tensors(graph: Any, mapping: dict[str, str]) -> None:
    """Rename tensors in `graph` (in place): node inputs and outputs, graph inputs and outputs, value infos."""
    for node in graph.node:
        node.input[:] = [mapping.get(name, name) for name in node.input]
        node.output[:] = [mapping.get(name, name) for name in node.output]
    for info in [*graph.input, *graph.output, *graph.value_info]:
        info.name = mapping.get(info.name, info.name)


def exit_on_rows(exit_model: Any) -> Any:
    """`exit_model` (inputs hidden [, mask]) computed on the first `exit_rows` rows only: a Slice of each input
    ahead of it. The engine passes all rows when it asks for the exit and none when it does not (the full model runs
    no inner exit head; an empty batch costs the head's op overheads only)."""
    import onnx
    from onnx import helper, numpy_helper

    graph = exit_model.graph
    names = [i.name for i in graph.input]
    rows = {name: f"{name}/exit_rows" for name in names}
    for node in graph.node:
        node.input[:] = [rows.get(name, name) for name in node.input]
    slices = [helper.make_node("Slice", [name, "exit/zero", EXIT_ROWS, "exit/zero"], [rows[name]]) for name in names]
    nodes = [*slices, *graph.node]  # the Slices first: the graph stays in topological order
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.append(numpy_helper.from_array(np.zeros(1, dtype=np.int64), "exit/zero"))
    graph.input.append(helper.make_tensor_value_info(EXIT_ROWS, onnx.TensorProto.INT64, [1]))
    return exit_model


def join(first: Any, second: Any, prefix: str, links: dict[str, str], outputs: list[str]) -> Any:
    """One model: `first`, then `second` reading `first`'s tensors. `links` maps `second`'s inputs to `first`'s
    tensors (an output, or an input both take, e.g. the mask: an input of the joined model either way); `second`'s
    other inputs stay inputs, its other names
    are prefixed with `prefix` (no clash with `first`'s initializers or nodes), and its outputs keep their names.
    `outputs`: the joined model's outputs, by name, from either side."""
    import onnx
    from onnx import compose, helper

    graph = compose.add_prefix_graph(second.graph, prefix)
    mapping = {prefix + name: target for name, target in links.items()}
    mapping.update({prefix + i.name: i.name for i in second.graph.input if i.name not in links})
    mapping.update({prefix + o.name: o.name for o in second.graph.output})
    rename_tensors(graph, mapping)
    known = {i.name for i in first.graph.input} | {name for node in first.graph.node for name in node.output}
    inputs = [*first.graph.input, *(i for i in graph.input if i.name not in known)]  # e.g. a mask first lacks
    by_name = {o.name: o for o in [*first.graph.output, *graph.output]}
    missing = [name for name in outputs if name not in by_name]
    if missing:
        raise ValueError(f"join: no output {missing} (have {sorted(by_name)})")
    joined = helper.make_graph(
        [*first.graph.node, *graph.node],
        first.graph.name,
        inputs,
        [by_name[name] for name in outputs],
        [*first.graph.initializer, *graph.initializer],
        value_info=[*first.graph.value_info, *graph.value_info],
    )
    versions: dict[str, int] = {}
    for opset in [*first.opset_import, *second.opset_import]:  # e.g. the int8 layer's ONNX Runtime contrib domain
        versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    opsets = [helper.make_opsetid(domain, version) for domain, version in versions.items()]
    model = helper.make_model(joined, opset_imports=opsets, ir_version=first.ir_version)
    onnx.checker.check_model(model)
    return model


def static_reshapes(model: Any) -> Any:
    """`model` with each Reshape whose target is assembled at run time from another tensor's dimensions (Shape →
    Gather → Unsqueeze → Concat: what tracing `x.view(batch, length, ...)` writes) given a constant target instead,
    where ONNX shape inference proves each such dimension equal to the reshaped tensor's own at that position (then
    written 0, "keep this dimension"); a target it cannot prove stays as it is. Why: at batch 1 a step is mostly
    small kernels, and each such target costs six of them per call (ONNX Runtime folds them only when the dimensions
    come from the reshaped tensor itself). The shape arithmetic left unused is dropped. Same result."""
    from onnx import numpy_helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    dims = {
        info.name: [d.dim_param or d.dim_value or None for d in info.type.tensor_type.shape.dim]
        for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    }
    producer = {name: node for node in model.graph.node for name in node.output}
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for node in model.graph.node:
        if node.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        target = _proven_target(producer.get(node.input[1]), dims.get(node.input[0]), producer, constants, dims)
        if target is not None:
            name = f"{node.output[0]}/static_shape"
            model.graph.initializer.append(numpy_helper.from_array(np.array(target, dtype=np.int64), name))
            node.input[1] = name
    return without_unused_nodes(model)


def _proven_target(concat: Any, data: list | None, producer: dict, constants: dict, dims: dict) -> list[int] | None:
    """The constant target of a Reshape of a tensor of dimensions `data` whose target `concat` assembles, or None."""
    if concat is None or concat.op_type != "Concat" or not data:
        return None
    target: list[int] = []
    for part in concat.input:
        if part in constants:
            target += np.atleast_1d(constants[part]).astype(np.int64).tolist()
            continue
        unsqueeze = producer.get(part)
        gather = (
            producer.get(unsqueeze.input[0]) if unsqueeze is not None and unsqueeze.op_type == "Unsqueeze" else None
        )
        shape = producer.get(gather.input[0]) if gather is not None and gather.op_type == "Gather" else None
        index = constants.get(gather.input[1]) if gather is not None else None
        if shape is None or shape.op_type != "Shape" or shape.attribute or index is None or index.ndim != 0:
            return None
        source = dims.get(shape.input[0]) or []
        position = len(target)
        if not (int(index) < len(source) and position < len(data) and source[int(index)] is not None):
            return None
        if source[int(index)] != data[position]:  # the same named (or the same fixed) dimension, or no proof
            return None
        target.append(0)
    return target


def without_unused_nodes(model: Any) -> Any:
    """`model` without the nodes none of whose outputs is read (by a node or as a graph output), to a fixpoint."""
    graph = model.graph
    while True:
        read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        kept = [node for node in graph.node if any(name in read for name in node.output)]
        if len(kept) == len(graph.node):
            return model
        del graph.node[:]
        graph.node.extend(kept)


def rename_output(model: Any, old: str, new: str) -> Any:
    """`model` with its output (and the tensor) `old` called `new`."""
    rename_tensors(model.graph, {old: new})
    return model


def externalize(model: Any, initializer: str, location: str) -> bytes:
    """Move `model`'s initializer `initializer` to the external file `location` (beside the model, written by the
    caller once for every model sharing it); returns its bytes."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    tensor = next((t for t in model.graph.initializer if t.name == initializer), None)
    if tensor is None:
        raise ValueError(f"no initializer {initializer!r} to move out of the graph")
    data = numpy_helper.to_array(tensor).tobytes()
    tensor.ClearField("float_data")
    tensor.raw_data = data
    set_external_data(tensor, location=location, offset=0, length=len(data))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return data
