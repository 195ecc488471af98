"""The facts each model family's record (``bertforge.models.registry.FamilySpec``) is the one
source of, read where they are used: the batch plan from its shape (the memory check of the
loaders agrees with it), the
ONNX heads from its exportable heads and what they leave out, the tokenizer kinds a model of it
reads, and the names ``bertforge`` exports for it. The numbers and tables here were captured
from the code before the facts moved into the records (issue 39) and must not change."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.errors import ConfigError, DataError
from bertforge.models.registry import BART, BERT, FAMILIES, MODERNBERT, resolve_config

SRC = Path(__file__).resolve().parents[2] / "src" / "bertforge"
CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"


# --- memory: the batch plan and the loaders' check -----------------------------------------------


@pytest.mark.parametrize("model, seq, gpus, memory, batch, precision, predictions, expected", [
    ("bert-large-uncased", 128, 8, 80, 65536, "bf16", None,
     (512, 16, 5.010251075029373, 0.10285055637359619, "bert")),
    ("bert-large-uncased", 512, 8, 80, 32768, "bf16", 80,
     (128, 32, 5.010251075029373, 0.41208457946777344, "bert")),
    ("bert-base-uncased", 128, 1, 24, 256, "fp32", None,
     (128, 2, 1.6407823860645294, 0.07902860641479492, "bert")),
    ("bart-large-preln", 128, 16, 80, 64000, "bf16", None,
     (32, 125, 6.0542755126953125, 0.15313982963562012, "bart")),
    ("bart-base", 512, 4, 40, 1024, "fp16", None,
     (64, 4, 2.077526092529297, 0.31959056854248047, "bart")),
    ("modernbert-base", 1024, 8, 80, 4096, "bf16", None,
     (64, 8, 2.230036735534668, 0.5911953449249268, "modernbert")),
    ("modernbert-large", 512, 2, 80, 512, "bf16", 150,
     (64, 4, 5.899096488952637, 0.5070617198944092, "modernbert")),
    ("bert-mini", 512, 1, 24, 1024, "bf16", None,
     (512, 2, 0.16792777180671692, 0.029736876487731934, "bert")),
])
def test_plans_are_unchanged(model, seq, gpus, memory, batch, precision, predictions,
                             expected) -> None:
    from bertforge.train.plan import plan_batch

    plan = plan_batch(model=model, seq_len=seq, gpus=gpus, gpu_memory_gib=memory,
                      global_batch_size=batch, precision=precision,
                      max_predictions=predictions)
    assert (plan.micro_batch_size, plan.accumulation, plan.states_gib,
            plan.activations_gib_per_seq, plan.family) == expected


def test_a_bart_plan_reads_as_before() -> None:
    from bertforge.train.plan import plan_batch

    plan = plan_batch(model="bart-large-preln", seq_len=128, gpus=16, gpu_memory_gib=80,
                      global_batch_size=64000)
    assert plan.summary().splitlines()[:4] == [
        "global batch 64000 = micro-batch 32 x 16 GPUs x 125 accumulation steps",
        "estimated memory per GPU: 11.0 of 80 GiB (model states 6.1 GiB, activations 157 MiB "
        "per sequence)",
        "config: --train.global_batch_size=64000 --train.micro_batch_size=32",
        "learning rate: --optim.name=lamb --optim.lr=6.00e-03 (NVIDIA's BART phase 1's value at "
        "this batch), or --optim.name=adamw --optim.lr=1.58e-03 (square-root scaling from the "
        "BERT paper's 1.0e-04 at 256; AdamW is not advised at this batch size: use LAMB)"]
    assert "--config pretrain/bart-large-phase1 " in plan.command()


def test_a_sequence_past_the_positions_of_the_record_is_refused() -> None:
    from bertforge.train.plan import plan_batch

    with pytest.raises(ConfigError, match="sequence length 2048 exceeds bart-base's "
                                          "max_position_embeddings \\(1024\\)"):
        plan_batch(model="bart-base", seq_len=2048, gpus=1, gpu_memory_gib=80,
                   global_batch_size=8)


@pytest.mark.parametrize("model, weights, training, costliest", [
    ("bert-base-uncased", 440448264, 1761780768, None),
    ("bert-large-uncased", 1344933128, 5379720224, ("num_hidden_layers", 24)),
    ("bart-base", 557689856, 2230734848, None),
    ("bart-large-preln", 1625190400, 6500737024, None),
    ("modernbert-base", 598686464, 2394549248, None),
    ("modernbert-large", 1583592192, 6334172160, ("intermediate_size", 2624)),
])
def test_memory_estimates_are_unchanged(model, weights, training, costliest) -> None:
    from bertforge.models.checks import costliest_key, model_bytes

    config = resolve_config(model)[1]
    assert model_bytes(config) == weights and model_bytes(config, 16) == training
    assert costliest_key(config) == costliest


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_memory_check_counts_what_the_record_says(family) -> None:
    """models/checks.py sits below the registry (an import cycle otherwise) and reads the
    config's interface: the record's shape must give the same numbers, preset by preset."""
    from bertforge.models.checks import POSITION_ID_BYTES, model_bytes

    for name in family.config_class().presets:
        config = resolve_config(name)[1]
        shape = family.model_shape(config)
        assert model_bytes(config, 4) == 4 * shape.parameters + POSITION_ID_BYTES * shape.positions


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_shape_has_a_decoder_exactly_when_its_family_is_seq2seq(family) -> None:
    for name in family.config_class().presets:
        shape = family.model_shape(resolve_config(name)[1])
        assert (shape.decoder is not None) == family.seq2seq, name


def test_the_memory_check_names_the_parameter_count(monkeypatch) -> None:
    import bertforge.models.checks as checks

    config = resolve_config("modernbert-large")[1]
    monkeypatch.setattr(checks, "available_memory", lambda device: 2**30)
    with pytest.raises(ConfigError) as error:
        checks.check_memory(config, "cpu", "big/config.json")
    assert str(error.value) == (
        "big/config.json: intermediate_size=2,624 gives a model of 395,881,664 parameters that "
        "needs at least 1.5 GiB for its weights, but only 1.0 GiB of RAM is available; check "
        "intermediate_size in big/config.json (or use a machine with more memory)")


def attributes(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Attribute)}


def test_plan_reads_no_config_field_by_name() -> None:
    fields = {"hidden_size", "d_model", "num_hidden_layers", "encoder_layers", "decoder_layers",
              "intermediate_size", "vocab_size", "padded_vocab_size", "max_position_embeddings",
              "num_parameters", "seq2seq"}
    assert attributes(SRC / "train" / "plan.py") & fields == set()


# --- export -------------------------------------------------------------------------------------


def test_export_heads_are_unchanged() -> None:
    from bertforge.export.heads import EXPORTABLE, HEADS

    bert = ("input_ids", "attention_mask", "token_type_ids")
    modern = ("input_ids", "attention_mask")
    heads = {"base": ("feature-extraction", ("last_hidden_state", "pooler_output")),
             "masked-lm": ("fill-mask", ("logits",)),
             "question-answering": ("question-answering", ("start_logits", "end_logits")),
             "sequence-classification": ("text-classification", ("logits",)),
             "token-classification": ("token-classification", ("logits",))}
    names = {"base": "Model", "masked-lm": "ForMaskedLM", "question-answering":
             "ForQuestionAnswering", "sequence-classification": "ForSequenceClassification",
             "token-classification": "ForTokenClassification"}
    expected = {}
    for prefix, family, inputs in (("Bert", "BERT", bert), ("ModernBert", "ModernBERT", modern)):
        for head, (task, outputs) in heads.items():
            omitted = ("pooler_output",) if family == "ModernBERT" and head == "base" else ()
            expected[prefix + names[head]] = (head, task, inputs, family, omitted,
                                              tuple(o for o in outputs if o not in omitted))
    got = {k: (v.head, v.task.name, v.inputs, v.family, v.omitted, v.outputs)
           for k, v in EXPORTABLE.items() if v.family in ("BERT", "ModernBERT")}  # a new family
    # adds its own entries: every exportable head of every record has one
    assert {(f.name, h) for f in FAMILIES for h in f.exportable} == {
        (v.family, v.head) for v in EXPORTABLE.values()}
    assert got == expected and all(k == v.architecture for k, v in EXPORTABLE.items())
    assert list(HEADS) == ["BertModel", "BertForMaskedLM", "BertForQuestionAnswering",
                           "BertForSequenceClassification", "BertForTokenClassification"]


def test_export_decides_nothing_by_a_family_name() -> None:
    names = {f.name for f in FAMILIES} | {t for f in FAMILIES for t in f.model_types}
    tree = ast.parse((SRC / "export" / "heads.py").read_text(encoding="utf-8"))
    keyed = [n.lineno for n in ast.walk(tree)
             if (isinstance(n, ast.Compare) and any(isinstance(c, ast.Constant)
                                                    and c.value in names
                                                    for c in (n.left, *n.comparators)))
             or (isinstance(n, ast.Dict) and any(isinstance(k, ast.Constant)
                                                 and k.value in names for k in n.keys))]
    assert keyed == []


# --- tokenizers ---------------------------------------------------------------------------------


def test_loading_knows_exactly_the_kinds_the_records_name() -> None:
    from bertforge.tokenization.loading import KINDS

    assert set(KINDS) == {kind for family in FAMILIES for kind in family.tokenizers}
    assert (BERT.tokenizer, BART.tokenizer, MODERNBERT.tokenizer) == (
        "wordpiece", "bpe", "modernbert")


def model_dir(root: Path, kind: str, model_type: str | None) -> Path:
    """A directory with a tokenizer of ``kind`` trained on the tiny corpus and a config.json
    saying ``model_type`` (none when None; no config.json at all when "-")."""
    from bertforge.tokenization.training import train_bpe, train_modern_bpe, train_wordpiece

    out = root / f"{kind}-{model_type}"
    if kind == "wordpiece":
        train_wordpiece([CORPUS], 200, out / "vocab.txt", min_frequency=1, progress=False)
    else:
        train = train_bpe if kind == "bpe" else train_modern_bpe
        train([CORPUS], 300, out, min_frequency=1, progress=False)
    if model_type != "-":
        config = {} if model_type is None else {"model_type": model_type}
        (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("kind, model_type, cls", [
    ("wordpiece", "bert", "BertTokenizer"),
    ("wordpiece", None, "BertTokenizer"),          # Google's configs name no model_type: BERT
    ("bpe", "bart", "BpeTokenizer"),
    ("modernbert", "modernbert", "ModernBpeTokenizer"),
    ("modernbert", "-", "ModernBpeTokenizer"),     # no model: its special tokens tell
    ("bpe", "-", "BpeTokenizer"),
    ("bpe", "roberta", "BpeTokenizer"),            # a family bertforge does not know: the files
])
def test_a_model_directory_gives_the_tokenizer_its_family_reads(kind, model_type, cls,
                                                                tmp_path) -> None:
    from bertforge.tokenization import load_tokenizer, read_vocab_tokens

    directory = model_dir(tmp_path, kind, model_type)
    tokenizer = load_tokenizer(directory)
    assert type(tokenizer).__name__ == cls
    assert read_vocab_tokens(directory) == list(tokenizer.vocab)


@pytest.mark.parametrize("kind, model_type, message", [
    ("bpe", "bert", "holds a byte-level BPE (BART's) tokenizer, but its config.json is a BERT "
                    "model, which reads WordPiece (BERT's) tokenizers"),
    ("wordpiece", "modernbert", "holds a WordPiece (BERT's) tokenizer, but its config.json is a "
                                "ModernBERT model, which reads byte-level BPE with BERT's special "
                                "tokens (ModernBERT's) tokenizers"),
    ("modernbert", "bart", "holds a byte-level BPE with BERT's special tokens (ModernBERT's) "
                           "tokenizer, but its config.json is a BART model, which reads "
                           "byte-level BPE (BART's) tokenizers"),
    ("bpe", "modernbert", "holds a byte-level BPE (BART's) tokenizer, but its config.json is a "
                          "ModernBERT model, which reads byte-level BPE with BERT's special "
                          "tokens (ModernBERT's) tokenizers"),
])
def test_a_tokenizer_its_model_cannot_read_is_refused(kind, model_type, message,
                                                      tmp_path) -> None:
    from bertforge.tokenization import load_tokenizer

    directory = model_dir(tmp_path, kind, model_type)
    with pytest.raises(DataError) as error:
        load_tokenizer(directory)
    assert str(error.value) == (f"{directory} {message}; save the model with the tokenizer it "
                                "was trained with")


def test_a_tokenizer_file_is_judged_by_the_model_beside_it(tmp_path) -> None:
    from bertforge.tokenization import BertTokenizer, load_tokenizer

    directory = model_dir(tmp_path, "wordpiece", "bert")
    assert isinstance(load_tokenizer(directory / "vocab.txt"), BertTokenizer)
    (directory / "config.json").write_text(json.dumps({"model_type": "bart"}))
    with pytest.raises(DataError, match="holds a WordPiece \\(BERT's\\) tokenizer, but its "
                                        "config.json is a BART model"):
        load_tokenizer(directory / "vocab.txt")



def test_a_caller_that_opened_the_model_gives_its_family(tmp_path, monkeypatch) -> None:
    """A run opened the model (config.json read once): the tokenizer check takes that family
    instead of reading config.json again, and refuses the same way."""
    import bertforge.tokenization.loading as loading

    directory = model_dir(tmp_path, "bpe", "bart")
    assert type(loading.load_tokenizer(directory, BART)).__name__ == "BpeTokenizer"
    monkeypatch.setattr(loading, "_family_in", lambda d: pytest.fail("config.json read again"))
    assert type(loading.load_tokenizer(directory, BART)).__name__ == "BpeTokenizer"
    with pytest.raises(DataError, match="but its config.json is a BERT model"):
        loading.load_tokenizer(directory, BERT)

# --- public names -------------------------------------------------------------------------------

BEFORE = [  # dir(bertforge) right after `import bertforge`, before issue 39
    "Any", "BartConfig", "BartForConditionalGeneration", "BartForSequenceClassification",
    "BartModel", "BertConfig", "BertForMaskedLM", "BertForMultipleChoice", "BertForPreTraining",
    "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification",
    "BertModel", "BertTokenizer", "BpeTokenizer", "FinetuneConfig", "GenerationConfig",
    "InputError", "ModernBertConfig", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification", "ModernBertModel", "Pipeline", "PretrainConfig",
    "annotations", "convert_nvidia_checkpoint", "finetune", "generate", "importlib",
    "load_config", "load_pipeline", "load_tokenizer", "pipeline", "pretrain"]


def test_every_public_name_stays_and_import_bertforge_stays_torch_free() -> None:
    code = ("import sys, json, bertforge\n"
            "assert 'torch' not in sys.modules\n"
            "from bertforge import cli\n"
            "bertforge.load_config\n"
            "cheap = 'torch' not in sys.modules\n"
            "print(json.dumps([cheap, dir(bertforge), bertforge.__all__]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    cheap, names, exported = json.loads(out.stdout)
    assert cheap  # a submodule and a name of no family cost no torch
    assert set(BEFORE) <= set(names)
    records = {n for f in FAMILIES for n in f.public_names()}  # a new family's names join
    assert set(exported) == records | {"__version__"} | {
        n for n in BEFORE if n[0].isupper() or n in (
            "convert_nvidia_checkpoint", "finetune", "generate", "load_config", "load_pipeline",
            "load_tokenizer", "pipeline", "pretrain")} - {"Any"}


def test_family_names_are_the_records_classes() -> None:
    import bertforge

    for family in FAMILIES:
        assert getattr(bertforge, family.config.name) is family.config_class()
        for head in family.heads:
            cls = family.model_class(head)
            assert getattr(bertforge, cls.__name__) is cls
    from bertforge.models.convert import convert_nvidia_checkpoint

    assert bertforge.convert_nvidia_checkpoint is convert_nvidia_checkpoint
    with pytest.raises(AttributeError, match="module 'bertforge' has no attribute 'BertForX'"):
        bertforge.BertForX  # noqa: B018
