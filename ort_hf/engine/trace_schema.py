"""ORT's export without its output-structure pass: the outputs' structure is read from the trace.

Before tracing, ORT 1.19.2's ``_get_exported_model`` runs the model once in PyTorch
(``_io.parse_outputs_for_onnx_export_and_extract_schema``, ``_graph_transition_manager.py:828``)
for two things: the structure of its outputs (the schema ORT rebuilds them with: ``ModelOutput``
class, keys, each tensor's dtype and rank, never a size), and their count, to name them
``output-<i>`` with every dimension dynamic (``output-<i>_dim<j>``) in ``torch.onnx.export``.

The trace runs the same forward, and ORT's ``_FlattenedModule.forward`` records the same schema
as it goes (``_io.py:140``). So the export here runs with no output names or output dynamic axes,
and afterwards the graph outputs get the names and dimensions torch's exporter would have given
them: it renames the output values (``_set_input_and_output_names``), which changes no node, and
writes output dynamic axes only when it serialises the graph. The graph is then byte for byte the
one ORT's way exports (``tests/engine/test_trace_schema.py``). Where that renaming is not what the
exporter would do (two outputs of one value, an output that is an input, a name in use), or the
trace left no schema, ORT's own export runs instead, pass included.
"""

from __future__ import annotations

import contextvars
import os

# True while an export runs whose output-structure pass is skipped (see model_hooks).
SKIP_STRUCTURE_PASS = contextvars.ContextVar("ort_hf_skip_structure_pass", default=False)


def export_with_schema_from_trace(original, **kwargs):
    """ORT's ``_get_exported_model`` (``original``) with the schema taken from the trace."""
    from .export_cache import ort_file_name

    module = kwargs["flattened_module"]
    cache_dir = kwargs.get("ortmodule_cache_dir")
    if cache_dir and os.path.isfile(os.path.join(cache_dir, ort_file_name(module))):
        return original(**kwargs)  # ORT loads its cached graph: only its pass gives the schema
    module._output_schema = None
    token = SKIP_STRUCTURE_PASS.set(True)
    try:
        model, _ = original(**{**kwargs, "ortmodule_cache_dir": ""})
    finally:
        SKIP_STRUCTURE_PASS.reset(token)
    schema = module._output_schema
    refusal = "the trace recorded no output schema" if schema is None else name_outputs(model, schema)
    if refusal:
        kwargs["logger"].info("ort_hf: exporting again with ORT's output-structure pass: %s.", refusal)
        return original(**kwargs)
    if cache_dir:  # what ORT's export writes into its cache folder (_graph_transition_manager.py:955)
        import onnx

        os.makedirs(cache_dir, exist_ok=True)
        onnx.save(model, os.path.join(cache_dir, ort_file_name(module)))
    return model, schema


def name_outputs(model, schema) -> str | None:
    """Name ``model``'s outputs ``output-<i>``, every dimension ``output-<i>_dim<j>``, as
    torch.onnx.export does given ORT's names and dynamic axes; or say why that cannot be done
    the exporter's way (nothing is changed then)."""
    from .output_schema import tensor_count

    outputs = [o.name for o in model.graph.output]
    if tensor_count(schema) != len(outputs):
        return f"the schema places {tensor_count(schema)} tensors, the graph has {len(outputs)} outputs"
    produced = {name for node in model.graph.node for name in node.output}
    used = produced | {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    new = [f"output-{i}" for i in range(len(outputs))]
    if len(set(outputs)) != len(outputs) or not set(outputs) <= produced:
        return "an output is repeated or is not computed by a node"
    if (used - set(outputs)) & set(new):
        return "a value of the graph is already named like an output"
    _rename(model.graph, dict(zip(outputs, new)))
    for i, output in enumerate(model.graph.output):
        for j, dim in enumerate(output.type.tensor_type.shape.dim):
            dim.dim_param = f"output-{i}_dim{j}"
    return None


def _rename(graph, names: dict) -> None:
    """Rename values throughout ``graph`` and the subgraphs that can read them."""
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename(sub, names)
    for info in (*graph.output, *graph.value_info):
        info.name = names.get(info.name, info.name)
