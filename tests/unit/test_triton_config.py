"""The generated Triton config.pbtxt is a valid ModelConfig and agrees with the ONNX graph.

How it is validated: Triton reads config.pbtxt with protobuf's text-format parser into its
``inference.ModelConfig`` message (model_config.proto). That .proto file cannot be fetched here,
so the test builds the subset of the schema bertforge writes as a ``descriptor_pb2``
FileDescriptorProto, with Triton's documented message, field and enum names, field types and
numbers (``ModelConfig.name/platform/max_batch_size/input/output/dynamic_batching``,
``ModelInput``/``ModelOutput.name/data_type/dims``, ``ModelDynamicBatching.
preferred_batch_size/max_queue_delay_microseconds``, the ``DataType`` enum), and parses the
file with ``google.protobuf.text_format``: an unknown field, a misspelt enum value or a wrong
type fails exactly as it would in tritonserver. The parsed message is then compared with the
ONNX graph (names, element types, shapes) read with ``onnx``.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from bertforge.export import HEADS, export_onnx, triton_config
from bertforge.models import BertConfig
from bertforge.tokenization import BertTokenizer

F = descriptor_pb2.FieldDescriptorProto
DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32",
              "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
              "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]
"""Triton's DataType enum, values 0..14 in this order."""
ONNX_TO_TRITON = {onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.FLOAT: "TYPE_FP32"}


def _field(name: str, number: int, kind: int, label: int = F.LABEL_OPTIONAL,
           type_name: str | None = None) -> F:
    field = F(name=name, number=number, type=kind, label=label)
    if type_name:
        field.type_name = type_name
    return field


def _model_config_class() -> type:
    """The ModelConfig message class of the schema subset described in the module docstring."""
    proto = descriptor_pb2.FileDescriptorProto(name="bertforge_test_model_config.proto",
                                               package="inference", syntax="proto3")
    data_type = proto.enum_type.add(name="DataType")
    for number, name in enumerate(DATA_TYPES):
        data_type.value.add(name=name, number=number)
    tensor = {"ModelInput": 4, "ModelOutput": 3}  # field number of `dims` in each message
    for message, dims_number in tensor.items():
        msg = proto.message_type.add(name=message)
        msg.field.extend([_field("name", 1, F.TYPE_STRING),
                          _field("data_type", 2, F.TYPE_ENUM, type_name=".inference.DataType"),
                          _field("dims", dims_number, F.TYPE_INT64, F.LABEL_REPEATED)])
    batching = proto.message_type.add(name="ModelDynamicBatching")
    batching.field.extend([_field("preferred_batch_size", 1, F.TYPE_INT32, F.LABEL_REPEATED),
                           _field("max_queue_delay_microseconds", 2, F.TYPE_UINT64)])
    config = proto.message_type.add(name="ModelConfig")
    config.field.extend([
        _field("name", 1, F.TYPE_STRING),
        _field("platform", 2, F.TYPE_STRING),
        _field("max_batch_size", 4, F.TYPE_INT32),
        _field("input", 5, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".inference.ModelInput"),
        _field("output", 6, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".inference.ModelOutput"),
        _field("dynamic_batching", 11, F.TYPE_MESSAGE, type_name=".inference.ModelDynamicBatching"),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


ModelConfig = _model_config_class()


def parse(text: str):
    return text_format.Parse(text, ModelConfig())


def _config() -> BertConfig:
    return BertConfig.from_preset("bert-tiny", vocab_size=40, num_labels=5)


@pytest.mark.parametrize("architecture", list(HEADS))
def test_every_head_config_parses_with_documented_fields(architecture: str) -> None:
    config = _config()
    parsed = parse(triton_config("m", HEADS[architecture], config, max_batch_size=16,
                                 max_queue_delay_us=250))
    assert parsed.name == "m" and parsed.platform == "onnxruntime_onnx"
    assert parsed.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in parsed.input] == [
        (n, DATA_TYPES.index("TYPE_INT64"), [-1])
        for n in ("input_ids", "attention_mask", "token_type_ids")]
    want = HEADS[architecture].output_dims(config)
    assert [o.name for o in parsed.output] == list(want)
    for output in parsed.output:
        assert output.data_type == DATA_TYPES.index("TYPE_FP32")
        assert tuple(output.dims) == want[output.name]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 250
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 8, 16]


def test_head_dims() -> None:
    config = _config()
    assert HEADS["BertForSequenceClassification"].output_dims(config) == {"logits": (5,)}
    assert HEADS["BertForTokenClassification"].output_dims(config) == {"logits": (-1, 5)}
    assert HEADS["BertForMaskedLM"].output_dims(config) == {"logits": (-1, 40)}
    assert HEADS["BertModel"].output_dims(config) == {"last_hidden_state": (-1, 128),
                                                      "pooler_output": (128,)}


def test_schema_check_is_strict() -> None:
    """The validator rejects what tritonserver would: unknown fields, enum values, types."""
    good = triton_config("m", HEADS["BertForQuestionAnswering"], _config())
    parse(good)
    for bad in (good.replace("max_batch_size", "max_batchsize"),
                good.replace("TYPE_FP32", "TYPE_FLOAT32"),
                good.replace("max_queue_delay_microseconds: 500", 'max_queue_delay_microseconds: "x"')):
        with pytest.raises(text_format.ParseError):
            parse(bad)
    with pytest.raises(ValueError, match="max_batch_size"):
        triton_config("m", HEADS["BertModel"], _config(), max_batch_size=0)


def test_small_max_batch_size_keeps_preferred_sizes_within_it() -> None:
    parsed = parse(triton_config("m", HEADS["BertModel"], _config(), max_batch_size=2))
    assert list(parsed.dynamic_batching.preferred_batch_size) == []


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real export with ``triton=True`` of a tiny token-classification model."""
    from bertforge.models import BertForTokenClassification

    root = tmp_path_factory.mktemp("triton")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(35))]
    BertForTokenClassification(_config()).save_pretrained(root / "model",
                                                           tokenizer=BertTokenizer(vocab))
    report = export_onnx(root / "model", root / "ner export", triton=True)
    assert report.triton_dir == root / "ner export" / "triton" / "ner_export"
    # Every path the summary names exists (it once pointed at a README that did not).
    line = next(x for x in report.summary().splitlines() if "Triton" in x)
    readme = root / "ner export" / "triton" / "README.md"
    assert f"see {readme})" in line and readme.is_file(), line
    return root / "ner export"


def test_repository_layout_and_readme(repository: Path) -> None:
    model = repository / "triton" / "ner_export"
    assert (model / "config.pbtxt").is_file()
    assert (model / "1" / "model.onnx").read_bytes() == (repository / "model.onnx").read_bytes()
    readme = (repository / "triton" / "README.md").read_text()
    assert "tritonserver --model-repository=" in readme
    assert "nvcr.io/nvidia/tritonserver" in readme
    assert "/v2/models/ner_export/infer" in readme
    assert "tritonclient.http" in readme and 'client.infer("ner_export"' in readme


def test_config_matches_the_onnx_graph(repository: Path) -> None:
    model = repository / "triton" / "ner_export"
    parsed = parse((model / "config.pbtxt").read_text())
    assert parsed.name == "ner_export"  # Triton requires the directory name
    graph = onnx.load(model / "1" / "model.onnx").graph
    for declared, actual in ((parsed.input, graph.input), (parsed.output, graph.output)):
        assert [t.name for t in declared] == [t.name for t in actual]
        for t, g in zip(declared, actual):
            assert DATA_TYPES[t.data_type] == ONNX_TO_TRITON[g.type.tensor_type.elem_type]
            dims = g.type.tensor_type.shape.dim
            assert dims[0].dim_param  # the batch axis: implicit in Triton (max_batch_size > 0)
            onnx_dims = [-1 if d.dim_param else d.dim_value for d in dims[1:]]
            assert list(t.dims) == onnx_dims, t.name
