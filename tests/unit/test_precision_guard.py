"""Inference precision (issue 40): the CPU's units, int8 linear layers, the quality guard and
``precision="auto"`` in the pipelines and ``bertforge generate``, on any CPU (the units are
emulated; numerics are checked with a tolerance per precision)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.inference.pipelines import load_pipeline
from bertforge.inference.pipelines.numerics import PROBE, pipeline_probe
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.ops.linear import Int8Linear, Linear, quantize_linears
from bertforge.runtime import cpu, guard
from bertforge.runtime.cpu import CpuUnits, emulated_units
from bertforge.runtime.guard import (GUARD_COSINE, Probe, agreement, candidates,
                                     choose_precision, probe_vectors)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-:")
SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
             max_position_embeddings=128)
BF16_CPU = emulated_units("avx512_bf16,avx512_vnni")
VNNI_CPU = emulated_units("avx512_vnni")
BARE_CPU = emulated_units("none")


# -- the CPU's units ---------------------------------------------------------------------------
def test_cpuinfo_flags_name_the_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example Xeon\nflags\t\t: fpu sse avx2 "
                    "avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\n"
                    "model name\t: other\nflags\t\t: fpu\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        info if path == "/proc/cpuinfo" else path, *a, **k))
    name, flags = cpu._proc_cpuinfo()
    units = CpuUnits(name, flags)
    assert (units.name, units.bf16, units.int8) == ("Example Xeon", "amx_bf16", "amx_int8")
    assert "amx_bf16, amx_int8" in units.describe()


def test_emulated_units_and_what_auto_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (BF16_CPU.bf16, BF16_CPU.int8) == ("avx512_bf16", "avx512_vnni")
    assert (VNNI_CPU.bf16, VNNI_CPU.int8) == (None, "avx512_vnni")
    assert candidates(BF16_CPU)[0] == ["bf16", "int8"]
    assert candidates(VNNI_CPU)[0] == ["int8"]
    names, why = candidates(BARE_CPU)
    assert names == [] and "no bf16 or int8 units" in why
    monkeypatch.setenv(cpu.EMULATION_VARIABLE, "AVX_VNNI")
    assert cpu.cpu_units().int8 == "avx_vnni" and cpu.cpu_units().emulated


# -- int8 linear layers --------------------------------------------------------------------------
@pytest.mark.parametrize("reduce_range", [False, True])
def test_int8_linear_is_close_to_fp32_and_takes_an_activation(reduce_range: bool) -> None:
    torch.manual_seed(0)
    linear = Linear(96, 160)
    x = torch.randn(3, 7, 96)
    q = Int8Linear(linear, reduce_range)
    with torch.inference_mode():
        want, got = linear(x, "gelu"), q(x, "gelu")
    assert got.shape == want.shape == (3, 7, 160) and got.dtype == torch.float32
    error = (got - want).norm() / want.norm()
    assert 0 < error < (0.03 if reduce_range else 0.02)  # int8 rounding, not noise


def test_quantize_linears_keeps_tied_weights_and_can_be_undone() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10))
    tied = nn.Linear(8, 10, bias=False)
    tied.weight = model[0].weight  # (10, 8): a decoder sharing the embeddings
    model.append(tied)
    swaps = quantize_linears(model)
    assert [type(m) for m in model] == [nn.Embedding, Int8Linear, Int8Linear, nn.Linear]
    assert not model[1].reduce_range
    for parent, name, original in swaps:
        setattr(parent, name, original)
    assert [type(m) for m in model] == [nn.Embedding, nn.Linear, nn.Linear, nn.Linear]


# -- the guard -------------------------------------------------------------------------------------
@dataclass
class _Out:
    logits: torch.Tensor
    pooled: torch.Tensor | None = None


def test_probe_vectors_read_real_tokens_only() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    states = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    noisy = states.clone()
    noisy[mask == 0] = 1e6  # padding may hold anything
    a = probe_vectors(_Out(states, torch.ones(2, 4)), mask)
    b = probe_vectors((noisy, torch.ones(2, 4)), mask)
    assert [v.tolist() for v in a] == [v.tolist() for v in b]
    assert [len(v) for v in a] == [2 * 2 + 4, 1 * 2 + 4]
    assert agreement(a, b) == pytest.approx(1.0)
    assert agreement(a, [-v for v in b]) == pytest.approx(-1.0)


def _model_and_probe() -> tuple[nn.Module, Probe]:
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=120, num_labels=3,
                                                     **SHAPE)).eval()
    ids = torch.randint(5, 120, (4, 24))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    return model, Probe({"input_ids": ids, "attention_mask": mask}, mask)


def _logits(model: nn.Module, probe: Probe, precision) -> torch.Tensor:
    with torch.inference_mode(), precision.autocast():
        return model(**probe.inputs).logits.float()


def test_auto_takes_bf16_on_a_bf16_cpu_and_applies_it() -> None:
    model, probe = _model_and_probe()
    want = _logits(model, probe, guard.build_precision("fp32", torch.device("cpu")))
    choice, precision = choose_precision(model, torch.device("cpu"), "auto", probe,
                                         units=BF16_CPU)
    assert (choice.name, precision.name, precision.dtype) == ("bf16", "bf16", torch.bfloat16)
    assert choice.agreement >= GUARD_COSINE and "avx512_bf16" in choice.reason
    assert model.classifier.weight.dtype == torch.bfloat16  # stored once in bf16
    got = _logits(model, probe, precision)
    assert torch.allclose(got, want, atol=0.05) and not torch.equal(got, want)


def test_auto_takes_int8_on_a_vnni_cpu_when_the_guard_holds(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    model, probe = _model_and_probe()
    monkeypatch.setattr(guard, "GUARD_COSINE", 0.99)
    choice, precision = choose_precision(model, torch.device("cpu"), "auto", probe,
                                         units=VNNI_CPU)
    assert choice.name == precision.name == "int8" and precision.dtype is None
    assert any(isinstance(m, Int8Linear) for m in model.modules())


def test_a_chosen_int8_is_quantized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's int8 trial leaves its layers in when int8 is kept: no second quantization."""
    model, probe = _model_and_probe()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    made = []
    real = Int8Linear.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Int8Linear, "__init__", counted)
    choice, _ = choose_precision(model, torch.device("cpu"), "int8", probe, units=VNNI_CPU)
    assert choice.name == "int8" and 0 < len(made) <= linears


def test_auto_keeps_fp32_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    model, probe = _model_and_probe()
    choice, precision = choose_precision(model, torch.device("cpu"), "auto", probe,
                                         units=BARE_CPU)
    assert precision.name == "fp32" and "no bf16 or int8 units" in choice.reason
    monkeypatch.setattr(guard, "GUARD_COSINE", 1.5)  # no precision can hold it
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    choice, precision = choose_precision(model, torch.device("cpu"), "auto", probe,
                                         units=BF16_CPU)
    assert precision.name == "fp32"
    assert "bf16 reached" in choice.reason and "int8 reached" in choice.reason
    # the trials left the model as they found it: fp32 weights, no int8 layer
    assert not any(isinstance(m, Int8Linear) for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())


def test_an_asked_precision_runs_and_warns_where_it_is_emulated(
        caplog: pytest.LogCaptureFixture) -> None:
    model, probe = _model_and_probe()
    with caplog.at_level(logging.WARNING, "bertforge.precision"):
        choice, precision = choose_precision(model, torch.device("cpu"), "int8", probe,
                                             units=BARE_CPU)
    assert choice.name == "int8" and 0.9 < choice.agreement <= 1.0
    assert "no int8 unit" in caplog.text


# -- pipelines and commands ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("precision")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS,
                                            *[f"##{c}" for c in CHARS]])))
    base = BertConfig(vocab_size=tok.vocab_size, **SHAPE)
    torch.manual_seed(0)
    cls = BertForSequenceClassification(base.replace(
        num_labels=2, id2label={0: "no", 1: "yes"}, finetuning_task="glue/rte"))
    return {"cls": cls.save_pretrained(root / "cls", tokenizer=tok),
            "enc": BertModel(base).save_pretrained(root / "enc", tokenizer=tok)}


def test_the_probe_is_cut_to_the_pipelines_length(encoders: dict[str, Path]) -> None:
    pipe = load_pipeline(encoders["cls"], max_length=16, precision="fp32")
    probe = pipeline_probe(pipe)
    assert probe.mask.shape[0] == len(PROBE) and probe.mask.shape[1] <= 16
    assert pipe.truncation == "error"  # the probe's cutting left the pipeline as it was


def test_pipelines_choose_by_the_cpu_and_say_so(encoders: dict[str, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["the first text: short.", "a second one, a little longer than the first."]
    fp32 = load_pipeline(encoders["enc"], "feature-extraction", precision="fp32")
    want = torch.tensor([r["embedding"] for r in fp32(texts)])
    monkeypatch.setenv(cpu.EMULATION_VARIABLE, "avx512_bf16")
    auto = load_pipeline(encoders["enc"], "feature-extraction")
    assert auto.precision.name == "bf16"
    assert "avx512_bf16" in auto.describe()["precision_reason"]
    for pipe, tolerance in ((auto, 0.999), (load_pipeline(encoders["enc"], "feature-extraction",
                                                          precision="int8"), 0.99)):
        got = torch.tensor([r["embedding"] for r in pipe(texts)])
        cosines = torch.nn.functional.cosine_similarity(got, want)
        assert cosines.min() > tolerance and not torch.equal(got, want)
    monkeypatch.setenv(cpu.EMULATION_VARIABLE, "none")
    bare = load_pipeline(encoders["cls"])
    assert bare.precision.name == "fp32"
    assert "no bf16 or int8 units" in bare.describe()["precision_reason"]


def test_int8_classification_keeps_the_labels(encoders: dict[str, Path]) -> None:
    texts = [t for t, _ in PROBE]
    fp32 = load_pipeline(encoders["cls"], precision="fp32")
    int8 = load_pipeline(encoders["cls"], precision="int8")
    a, b = fp32(texts), int8(texts)
    assert [r["label"] for r in a] == [r["label"] for r in b]
    assert max(abs(x["score"] - y["score"]) for x, y in zip(a, b)) < 0.02


def test_precision_errors_are_one_line(encoders: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="precision must be one of auto, fp32, bf16, int8"):
        load_pipeline(encoders["cls"], precision="int4")


def test_generate_runs_in_int8_and_bf16(tiny_bart: Path, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    from bertforge.inference.generate import generate_file

    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat .\nthe dog ran in the park .\n")
    results = {}
    for precision in ("fp32", "bf16", "int8"):
        with caplog.at_level(logging.INFO, "bertforge.precision"):
            out = generate_file(tiny_bart, source, tmp_path / f"{precision}.jsonl",
                                overrides={"num_beams": 2}, device="cpu", precision=precision)
        results[precision] = [json.loads(line)["summary"] for line in out.read_text()
                              .splitlines()]
        assert f"precision {precision} ({precision}: as asked" in caplog.text
    assert all(len(r) == 2 for r in results.values())


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_bart_pipelines_run_in_bf16_and_int8(tiny_bart: Path, precision: str) -> None:
    """BART's encoder (fused projections) and its decoding steps take int8 layers too."""
    text = "the cat sat on the mat . the dog ran in the park ."
    summary = load_pipeline(tiny_bart, "summarization", precision=precision)(text)
    assert isinstance(summary["summary"], str)
    pipe = load_pipeline(tiny_bart, "feature-extraction", precision=precision)
    want = load_pipeline(tiny_bart, "feature-extraction", precision="fp32")(text)["embedding"]
    cosine = torch.nn.functional.cosine_similarity(torch.tensor(pipe(text)["embedding"]),
                                                   torch.tensor(want), dim=0)
    assert pipe.precision.name == precision and cosine > 0.99


def test_int8_bart_generates_under_inference_mode(tiny_bart: Path) -> None:
    """An int8 decoder decodes through the model's cache, which then sees inference tensors
    (no version counter) when a caller generates under ``torch.inference_mode``."""
    from bertforge.models.bart import BartForConditionalGeneration
    from bertforge.models.generation import generate

    model = BartForConditionalGeneration.from_pretrained(tiny_bart).eval()
    ids = torch.tensor([[0, 11, 12, 13, 14, 2]])
    want = generate(model, ids, torch.ones_like(ids), model.generation_config)
    quantize_linears(model)
    with torch.inference_mode():
        got = generate(model, ids, torch.ones_like(ids), model.generation_config)
    assert got.shape[0] == 1 and want.shape[0] == 1
