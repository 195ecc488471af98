"""fp32 parity of every bertforge ModernBERT class with the transformers class of the same name.

Tiny random configs (no downloads) with a sliding window of 8 (each token sees 4 each side) on
padded batches of 20-40 tokens, so that every local layer masks something; distinct RoPE bases
for global and local layers; biases and norm biases on, weights randomised with a large spread,
so that a weight copied to the wrong place, or a base used in the wrong layer, changes the
outputs. Both directions through model directories (transformers loads what bertforge saves
with no missing or unexpected keys, and vice versa), the padded and the unpadded paths, and
packed rows against their sequences run alone.
"""

from __future__ import annotations

import json

import pytest
import torch

import bertforge.models as bf
from bertforge.models.modernbert_config import ModernBertConfig

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=101, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
            num_attention_heads=4, max_position_embeddings=128, local_attention=8,
            global_attn_every_n_layers=3, global_rope_theta=500.0, local_rope_theta=23.0,
            pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2,
            norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)
CLASSES = ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertForQuestionAnswering",
           "ModernBertForMultipleChoice")
POOLED = ("ModernBertForSequenceClassification", "ModernBertForMultipleChoice")
CASES = [(name, pooling) for name in CLASSES
         for pooling in (("cls", "mean") if name in POOLED else ("cls",))]
LENGTHS = (40, 27, 20, 33, 21, 40)
TOL = 1e-4


def config(pooling: str = "cls", **overrides) -> ModernBertConfig:
    return ModernBertConfig(**{**TINY, "classifier_pooling": pooling, "num_labels": 3,
                               **overrides})


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Distinct O(0.1-1) values everywhere; LayerNorm scales near 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            scale_of_norm = "norm" in name.rsplit(".", 2)[-2] and name.endswith("weight")
            p.copy_(1.0 + 0.2 * noise if scale_of_norm else 0.15 * noise)


def make_batch(name: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B=3, S=40) right-padded rows of 40/27/20 tokens; (B=2, C=3, S=40) for multiple choice."""
    gen = torch.Generator().manual_seed(seed)
    rows = 6 if name == "ModernBertForMultipleChoice" else 3
    s = max(LENGTHS)
    ids = torch.randint(3, TINY["vocab_size"], (rows, s), generator=gen)
    mask = (torch.arange(s)[None, :] < torch.tensor(LENGTHS[:rows])[:, None]).long()
    ids = ids * mask  # padding id 0
    if name == "ModernBertForMultipleChoice":
        return ids.view(2, 3, s), mask.view(2, 3, s)
    return ids, mask


def compared(name: str, out, mask: torch.Tensor) -> list[torch.Tensor]:
    """The outputs worth comparing: per-token ones only at real tokens."""
    valid = mask.bool()
    if name == "ModernBertModel":
        return [out.last_hidden_state[valid]]
    if name == "ModernBertForQuestionAnswering":
        return [out.start_logits[valid], out.end_logits[valid]]
    if name in ("ModernBertForMaskedLM", "ModernBertForTokenClassification"):
        return [out.logits[valid]]
    return [out.logits]


def max_difference(name: str, ours, theirs) -> float:
    ids, mask = make_batch(name)
    with torch.no_grad():
        a = compared(name, ours(ids, attention_mask=mask), mask)
        b = compared(name, theirs(input_ids=ids, attention_mask=mask), mask)
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def hf_model(name: str, directory, **kwargs):
    cls = getattr(transformers, name)
    model, info = cls.from_pretrained(directory, attn_implementation="eager",
                                      output_loading_info=True, **kwargs)
    return model.eval(), info


def unpadded(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if hasattr(module, "unpad"):
            module.unpad = True
    return model


@pytest.mark.parametrize("name,pooling", CASES)
def test_bertforge_to_transformers(name, pooling, tmp_path):
    """bertforge saves; transformers loads every weight (nothing missing or unexpected) and
    computes the same logits; the unpadded path agrees too."""
    ours = getattr(bf, name)(config(pooling))
    randomize_(ours, seed=1)
    ours.eval().save_pretrained(tmp_path)
    theirs, info = hf_model(name, tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert theirs.config.layer_types == ours.config.resolved_layer_types()
    assert theirs.config.sliding_window == 4
    assert max_difference(name, ours, theirs) < TOL
    assert max_difference(name, unpadded(ours), theirs) < TOL


@pytest.mark.parametrize("name,pooling", CASES)
def test_transformers_to_bertforge(name, pooling, tmp_path):
    """transformers saves (its 5.x config.json: layer_types, rope_parameters); bertforge loads
    every weight and computes the same logits, padded and unpadded."""
    labels = 2 if name == "ModernBertForQuestionAnswering" else 3  # QA: start and end
    hf_config = transformers.ModernBertConfig(**{**TINY, "classifier_pooling": pooling,
                                                 "num_labels": labels})
    theirs = getattr(transformers, name)(hf_config)
    randomize_(theirs, seed=2)
    theirs.eval().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" in saved and "rope_parameters" in saved
    ours = getattr(bf, name).from_pretrained(tmp_path)
    assert ours.config.global_rope_theta == 500.0 and ours.config.local_rope_theta == 23.0
    assert max_difference(name, ours, theirs) < TOL
    assert max_difference(name, unpadded(ours), theirs) < TOL


def test_state_dict_keys_are_transformers_keys():
    for name in CLASSES:
        ours = getattr(bf, name)(config())
        theirs = getattr(transformers, name)(transformers.ModernBertConfig(
            **{**TINY, "num_labels": 3}))
        tied = {"decoder.weight"}
        assert set(ours.hf_state_dict()) == set(theirs.state_dict()) - tied, name


def test_published_config_format(tmp_path):
    """A config.json in the published checkpoints' dialect (global_attn_every_n_layers,
    global/local_rope_theta, no layer_types) means the same model to both libraries."""
    published = {"architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
                 "transformers_version": "4.48.0", "position_embedding_type": "absolute",
                 "layer_norm_eps": 1e-5, "gradient_checkpointing": False,
                 **{k: v for k, v in TINY.items()}, "global_attn_every_n_layers": 2,
                 "classifier_pooling": "mean"}
    ours = bf.ModernBertForMaskedLM(ModernBertConfig.from_dict(published))
    randomize_(ours, seed=3)
    ours.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(published))   # the published file only
    theirs, info = hf_model("ModernBertForMaskedLM", tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert theirs.config.layer_types == ["full_attention", "sliding_attention"] * 2
    assert theirs.config.rope_parameters["sliding_attention"]["rope_theta"] == 23.0
    loaded = bf.ModernBertForMaskedLM.from_pretrained(tmp_path)
    assert loaded.config.resolved_layer_types() == theirs.config.layer_types
    assert max_difference("ModernBertForMaskedLM", loaded, theirs) < TOL


def test_explicit_layer_types_round_trip(tmp_path):
    """A pattern no ``global_attn_every_n_layers`` gives (transformers 5.x can write one) is
    kept as ``layer_types`` and read back by transformers unchanged."""
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    ours = bf.ModernBertForTokenClassification(config(layer_types=kinds))
    randomize_(ours, seed=4)
    ours.eval().save_pretrained(tmp_path)
    theirs, _ = hf_model("ModernBertForTokenClassification", tmp_path)
    assert theirs.config.layer_types == kinds
    assert bf.ModernBertConfig.load(tmp_path).layer_types == kinds
    assert max_difference("ModernBertForTokenClassification", ours, theirs) < TOL


@pytest.mark.parametrize("unpad", [False, True])
def test_window_edge(unpad, tmp_path):
    """One local layer, window 4 each side: changing the token exactly 4 away changes a
    query's output, 5 away does not, in bertforge and in transformers alike."""
    cfg = config(num_hidden_layers=1, layer_types=["sliding_attention"])
    ours = bf.ModernBertModel(cfg)
    randomize_(ours, seed=5)
    ours.eval().save_pretrained(tmp_path)
    theirs, _ = hf_model("ModernBertModel", tmp_path)
    ours.unpad = unpad
    ids = torch.randint(3, 100, (1, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 22:] = 0
    query = 10
    for model in (ours, theirs):
        def hidden(x: torch.Tensor, model=model) -> torch.Tensor:
            with torch.no_grad():
                return model(input_ids=x, attention_mask=mask).last_hidden_state[0, query]
        base = hidden(ids)
        for distance, changes in ((4, True), (-4, True), (5, False), (-5, False)):
            edited = ids.clone()
            edited[0, query + distance] = 99 if ids[0, query + distance] != 99 else 98
            moved = float((hidden(edited) - base).abs().max())
            assert (moved > 1e-4) == changes, (type(model).__name__, distance, moved)


def _packed(lengths: list[list[int]], seed: int = 0):
    """Rows holding several documents each: ids, mask, position ids restarting per document,
    and the documents alone, one per row."""
    gen = torch.Generator().manual_seed(seed)
    s = max(sum(row) for row in lengths) + 3
    ids, mask, pos = (torch.zeros(len(lengths), s, dtype=torch.long) for _ in range(3))
    docs = []
    for r, row in enumerate(lengths):
        start = 0
        for n in row:
            doc = torch.randint(3, 100, (n,), generator=gen)
            ids[r, start:start + n], mask[r, start:start + n] = doc, 1
            pos[r, start:start + n] = torch.arange(n)
            docs.append(doc)
            start += n
    return ids, mask, pos, docs


@pytest.mark.parametrize("unpad", [False, True])
def test_packed_rows_equal_separate_documents(unpad):
    """Packed documents (position ids restarting at 0) give each document's logits alone:
    no attention across documents in global or local layers, RoPE positions per document."""
    model = bf.ModernBertForMaskedLM(config())
    randomize_(model, seed=6)
    model.eval().model.unpad = unpad
    ids, mask, pos, docs = _packed([[13, 20], [7, 9, 11], [30]])
    with torch.no_grad():
        packed = model(ids, attention_mask=mask, position_ids=pos,
                       masked_positions=mask.bool()).logits       # (T, V), row-major
        alone = torch.cat([model(doc[None]).logits[0] for doc in docs])
    assert float((packed - alone).abs().max()) < TOL


def test_packed_sequence_classification_pools_per_document():
    model = bf.ModernBertForSequenceClassification(config("mean"))
    randomize_(model, seed=7)
    ids, mask, pos, docs = _packed([[13, 20], [30]])
    with torch.no_grad():
        alone = torch.cat([model(doc[None]).logits for doc in docs])
        for unpad in (False, True):
            model.model.unpad = unpad
            packed = model(ids, attention_mask=mask, position_ids=pos).logits
            assert float((packed - alone).abs().max()) < TOL
