"""The output structure kept beside a cached graph reads back as ORT's pass produced it, type for type."""

from collections import OrderedDict, namedtuple

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from ort_hf.engine import output_schema

Pair = namedtuple("Pair", ["first", "second"])


@pytest.fixture(autouse=True, scope="module")
def _engine():
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ORT as ort_hf runs it (its NVTX decorators bridged on CPU)


def _ort_schema(outputs):
    """The schema ORT's FlattenedModule records for ``outputs`` (tensors and constants stubbed)."""
    from onnxruntime.training.utils.torch_io_helper import extract_data_and_schema

    return extract_data_and_schema(outputs, constant_as_tensor=True)[1]


def test_model_outputs_and_containers_read_back_equal():
    t = torch.zeros(2, 3)
    cases = [
        SequenceClassifierOutput(loss=torch.tensor(0.5), logits=t),
        CausalLMOutputWithPast(logits=t, hidden_states=((t, t), (t, t))),
        (t, None, "text", 3, 2.5, True),
        Pair(t.long(), [t, {"a": t}]),
        OrderedDict(b=t, a=[t.half()]),
        t,
    ]
    for outputs in cases:
        schema = _ort_schema(outputs)
        text = output_schema.dumps(schema)
        assert text is not None, outputs
        back = output_schema.loads(text)
        assert output_schema.same(back, schema) and type(back) is type(schema)
        assert output_schema.tensor_count(back) == len(_flat(outputs))


def _flat(outputs):
    from onnxruntime.training.utils.torch_io_helper import extract_data_and_schema

    return extract_data_and_schema(outputs, constant_as_tensor=True)[0]


def test_same_tells_containers_and_stub_fields_apart():
    t = torch.zeros(2)
    schema = _ort_schema((t, t))
    assert output_schema.same(schema, _ort_schema((t, t)))
    assert not output_schema.same(schema, _ort_schema([t, t]))
    assert not output_schema.same(schema, _ort_schema((t, t.long())))
    assert not output_schema.same(schema, _ort_schema((t, t[None])))


def test_what_cannot_be_kept_exactly_is_not_kept():
    t = torch.zeros(2)
    assert output_schema.dumps({1: _ort_schema(t)}) is None  # a non-string key
    assert output_schema.dumps((_ort_schema(t), object())) is None


def test_a_schema_naming_another_kind_of_class_is_refused():
    import json

    node = {"kind": "map", "type": "builtins:str", "items": []}
    with pytest.raises(ValueError):
        output_schema.loads(json.dumps(node))
    with pytest.raises(ValueError):
        output_schema.loads(json.dumps({"kind": "tensor"}))
