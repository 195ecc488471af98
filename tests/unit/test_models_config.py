"""BertConfig: presets, validation messages, JSON round trips and transformers compatibility."""

from __future__ import annotations

import json

import pytest

from bertforge.errors import ConfigError
from bertforge.models import PRESETS, BertConfig, get_preset, preset_names

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


@pytest.mark.parametrize(
    "name, layers, hidden, heads, ffn, vocab, lower",
    [
        ("bert-base-uncased", 12, 768, 12, 3072, 30522, True),
        ("bert-base-cased", 12, 768, 12, 3072, 28996, False),
        ("bert-large-uncased", 24, 1024, 16, 4096, 30522, True),
        ("bert-large-cased", 24, 1024, 16, 4096, 28996, False),
        ("bert-tiny", 2, 128, 2, 512, 30522, True),
        ("bert-mini", 4, 256, 4, 1024, 30522, True),
        ("bert-small", 4, 512, 8, 2048, 30522, True),
        ("bert-medium", 8, 512, 8, 2048, 30522, True),
    ],
)
def test_presets(name, layers, hidden, heads, ffn, vocab, lower) -> None:
    c = BertConfig.from_preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (layers, hidden, heads, ffn)
    assert (c.vocab_size, c.max_position_embeddings, c.do_lower_case) == (vocab, 512, lower)
    assert c.hidden_act == "gelu" and c.pre_layernorm is False and c.pad_vocab_size_multiple == 8
    assert BertConfig.load(name) == c


def test_preset_table_is_complete_and_copies() -> None:
    assert len(preset_names()) == len(PRESETS) == 9
    preln = get_preset("bert-mini-preln")
    assert preln["pre_layernorm"] and preln["hidden_dropout_prob"] == 0.0
    get_preset("bert-tiny")["hidden_size"] = 1  # callers get copies, the table stays intact
    assert PRESETS["bert-tiny"]["hidden_size"] == 128


def test_unknown_preset_names_closest_and_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        BertConfig.from_preset("bert-base-uncase")
    msg = str(err.value)
    assert "'bert-base-uncase'" in msg and "Did you mean 'bert-base-uncased'" in msg
    assert all(name in msg for name in PRESETS)
    with pytest.raises(ConfigError, match="neither an existing config.json.*Did you mean 'bert-mini'"):
        BertConfig.load("bert-minni")


def test_preset_overrides() -> None:
    c = BertConfig.from_preset("bert-tiny", pre_layernorm=True, hidden_dropout_prob=0.0)
    assert c.pre_layernorm and c.hidden_dropout_prob == 0.0 and c.hidden_size == 128
    with pytest.raises(ConfigError, match="unknown BertConfig override 'hiden_size'.*Did you mean 'hidden_size'"):
        BertConfig.from_preset("bert-tiny", hiden_size=64)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"hidden_size": 100, "num_attention_heads": 12}, r"hidden_size=100 is not divisible by num_attention_heads=12"),
        ({"hidden_act": "swish"}, r"hidden_act='swish' is not supported; use one of gelu, gelu_new, relu"),
        ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob must be a probability in \[0, 1\), got 1.5"),
        ({"vocab_size": 0}, r"vocab_size must be an integer >= 1, got 0"),
        ({"num_hidden_layers": True}, r"num_hidden_layers must be an integer >= 1, got True"),
        ({"pad_token_id": 99}, r"pad_token_id=99 is outside the vocabulary \(vocab_size=99\)"),
        ({"layer_norm_eps": 0}, r"layer_norm_eps must be a positive finite number"),
        ({"pad_vocab_size_multiple": 0}, r"pad_vocab_size_multiple must be an integer >= 1"),
        ({"num_labels": 3, "id2label": {0: "a", 1: "b"}}, r"id2label has keys \[0, 1\] but num_labels=3"),
        ({"do_lower_case": "yes"}, r"do_lower_case must be true, false or null"),
    ],
)
def test_validation_messages(overrides, pattern) -> None:
    with pytest.raises(ConfigError, match=pattern):
        BertConfig(**{**TINY, **overrides})


@pytest.mark.parametrize("multiple, padded", [(8, 30528), (1, 30522), (64, 30528), (128, 30592)])
def test_padded_vocab_size(multiple, padded) -> None:
    assert BertConfig(pad_vocab_size_multiple=multiple).padded_vocab_size == padded


def test_json_round_trip_and_file_errors(tmp_path) -> None:
    c = BertConfig(**TINY, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, do_lower_case=False,
                   architectures=["BertForSequenceClassification"])
    c.to_json_file(tmp_path / "config.json")
    assert not [p for p in tmp_path.iterdir() if p.name != "config.json"]  # no temp file left
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "bert" and data["label2id"] == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig.load(tmp_path) == c == BertConfig.load(tmp_path / "config.json")

    (tmp_path / "bad.json").write_text('{"hidden_size": 32,\n "vocab_size": }')
    with pytest.raises(ConfigError, match=r"bad.json:2:\d+: not valid JSON"):
        BertConfig.from_json_file(tmp_path / "bad.json")
    (tmp_path / "typo.json").write_text(json.dumps({**TINY, "num_hiden_layers": 3}))
    with pytest.raises(ConfigError, match=r"typo.json: unknown BertConfig key 'num_hiden_layers'.*'num_hidden_layers'"):
        BertConfig.from_json_file(tmp_path / "typo.json")
    (tmp_path / "heads.json").write_text(json.dumps({**TINY, "num_attention_heads": 5}))
    with pytest.raises(ConfigError, match=r"heads.json: .*not divisible by num_attention_heads=5"):
        BertConfig.load(tmp_path / "heads.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="directory without config.json"):
        BertConfig.load(tmp_path / "empty")


def test_transformers_written_json_is_tolerated_but_semantics_checked() -> None:
    hf_like = {**TINY, "model_type": "bert", "transformers_version": "4.8.2", "gradient_checkpointing": False,
               "use_cache": True, "position_embedding_type": "absolute", "_name_or_path": "x"}
    assert BertConfig.from_dict(hf_like).hidden_size == 32
    with pytest.raises(ConfigError, match="position_embedding_type='relative_key' is not supported"):
        BertConfig.from_dict({**hf_like, "position_embedding_type": "relative_key"})
    with pytest.raises(ConfigError, match="model_type is 'roberta', not 'bert'"):
        BertConfig.from_dict({**hf_like, "model_type": "roberta"})
    with pytest.raises(ConfigError, match="tie_word_embeddings=false is not supported"):
        BertConfig.from_dict({**hf_like, "tie_word_embeddings": False})
    with pytest.raises(ConfigError, match="num_labels=4 but id2label has 2 entries"):
        BertConfig.from_dict({**hf_like, "num_labels": 4, "id2label": {"0": "a", "1": "b"}})


def test_replace_resets_label_names_when_count_changes() -> None:
    c = BertConfig(**TINY, num_labels=2, id2label={0: "no", 1: "yes"})
    assert c.replace(num_labels=3).id2label is None
    assert c.replace(hidden_dropout_prob=0.0).id2label == {0: "no", 1: "yes"}


def test_pre_layernorm_is_marked_bertforge_only() -> None:
    assert "bertforge_only" not in BertConfig(**TINY).to_dict()
    data = BertConfig(**TINY, pre_layernorm=True).to_dict()
    assert data["pre_layernorm"] is True and "transformers has no pre-LayerNorm BERT" in data["bertforge_only"]
    assert BertConfig.from_dict(data).pre_layernorm is True


def test_config_json_loads_in_transformers(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    ours = BertConfig(**TINY, hidden_act="gelu_new", layer_norm_eps=1e-7, num_labels=3, do_lower_case=True,
                      architectures=["BertForTokenClassification"])
    ours.to_json_file(tmp_path / "config.json")
    for theirs in (transformers.BertConfig.from_pretrained(tmp_path), transformers.AutoConfig.from_pretrained(tmp_path)):
        assert type(theirs).__name__ == "BertConfig"
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "hidden_act", "layer_norm_eps", "max_position_embeddings", "type_vocab_size", "pad_token_id"):
            assert getattr(theirs, key) == getattr(ours, key), key
        assert theirs.num_labels == 3 and theirs.architectures == ["BertForTokenClassification"]
    # And what transformers writes back (with its many extra keys) reads into an equal config.
    transformers.BertConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "hf")
    again = BertConfig.load(tmp_path / "hf")
    assert again.replace(id2label=None) == ours.replace(id2label=None)


def test_importing_the_package_does_not_import_torch() -> None:
    # Every CLI call (even --help) imports bertforge; the model classes load lazily on first use.
    import subprocess
    import sys

    code = "import sys, bertforge; assert 'torch' not in sys.modules; print(bertforge.BertConfig.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "BertConfig"


@pytest.mark.parametrize("width, heads, split", [(768, 5, "12 heads of 64"),
                                                 (100, 3, "2 heads of 50"),
                                                 (7, 2, "1 head of 7")])
def test_an_indivisible_head_count_suggests_one_that_divides(width, heads, split) -> None:
    from bertforge.errors import ConfigError
    from bertforge.models import BertConfig
    from bertforge.models.bart_config import BartConfig

    with pytest.raises(ConfigError, match=rf"choose a head count that divides it \(e\.g\. {split}\)"):
        BertConfig(hidden_size=width, num_attention_heads=heads, intermediate_size=16)
    with pytest.raises(ConfigError, match=rf"\(e\.g\. {split}\)"):
        BartConfig(d_model=width, encoder_attention_heads=heads, decoder_attention_heads=heads)
