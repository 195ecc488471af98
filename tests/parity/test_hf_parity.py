"""fp32 parity of every bertforge BERT class with the transformers class of the same name.

Both directions: transformers -> bertforge and bertforge -> transformers, through model directories
(save_pretrained / from_pretrained) and through in-memory state dicts. Weights are randomised with a
large spread (biases and LayerNorm parameters included) so that a weight copied to the wrong place,
or not copied at all, changes the outputs.
"""

from __future__ import annotations

import pytest
import torch

import bertforge.models as bf

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
# (bertforge class, constructor kwargs, transformers config kwargs)
CLASSES = {
    "BertModel": ({}, {}),
    "BertForPreTraining": ({}, {}),
    "BertForMaskedLM": ({}, {}),
    "BertForQuestionAnswering": ({}, {}),
    "BertForSequenceClassification": ({"num_labels": 3}, {"num_labels": 3}),
    "BertForMultipleChoice": ({}, {}),
    "BertForTokenClassification": ({"num_labels": 5}, {"num_labels": 5}),
}
TOL = 1e-5


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter gets distinct, O(0.1-1) values; LayerNorm scales stay near 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.15 * noise)


def make_batch(name: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B=3, S=10) with lengths 10/6/3, two segments; (B=2, C=3, S=10) for multiple choice."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([10, 6, 3, 8, 5, 10])
    rows = 6 if name == "BertForMultipleChoice" else 3
    ids = torch.randint(1, TINY["vocab_size"], (rows, 10), generator=gen)
    mask = (torch.arange(10)[None, :] < lengths[:rows, None]).long()
    types = ((torch.arange(10)[None, :] >= (lengths[:rows, None] // 2)) & mask.bool()).long()
    ids = ids * mask  # [PAD] = 0 at padding
    if name == "BertForMultipleChoice":
        return ids.view(2, 3, 10), mask.view(2, 3, 10), types.view(2, 3, 10)
    return ids, mask, types


def outputs_at_valid(name: str, out, mask: torch.Tensor, hf: bool) -> list[torch.Tensor]:
    """The outputs worth comparing: per-token ones only where mask == 1."""
    valid = mask.bool()
    if name == "BertModel":
        return [out.last_hidden_state[valid], out.pooler_output]
    if name == "BertForPreTraining":
        mlm, nsp = (out.prediction_logits, out.seq_relationship_logits) if hf else (out.mlm_logits, out.nsp_logits)
        return [mlm[valid], nsp]
    if name == "BertForQuestionAnswering":
        return [out.start_logits[valid], out.end_logits[valid]]
    if name in ("BertForMaskedLM", "BertForTokenClassification"):
        return [out.logits[valid]]
    return [out.logits]


def assert_same_outputs(name: str, ours, theirs) -> None:
    ids, mask, types = make_batch(name)
    with torch.no_grad():
        a = outputs_at_valid(name, ours(ids, attention_mask=mask, token_type_ids=types), mask, hf=False)
        b = outputs_at_valid(name, theirs(input_ids=ids, attention_mask=mask, token_type_ids=types), mask, hf=True)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        assert (x - y).abs().max().item() <= TOL, f"{name}: max abs diff {(x - y).abs().max().item():.3g}"


def hf_model(name: str, seed: int, **config_kwargs):
    config = transformers.BertConfig(**TINY, **CLASSES[name][1], **config_kwargs, attn_implementation="eager")
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config)
    randomize_(model, seed)
    return model.eval()


def our_model(name: str, seed: int, **config_kwargs):
    model = getattr(bf, name)(bf.BertConfig(**TINY, **config_kwargs), **CLASSES[name][0])
    randomize_(model, seed)
    with torch.no_grad():  # rows past vocab_size are padding: zero in every bertforge model
        model.word_embeddings().weight[TINY["vocab_size"]:] = 0
        if hasattr(model, "cls"):
            model.cls.predictions.bias[TINY["vocab_size"]:] = 0
    return model.eval()


@pytest.mark.parametrize("name", list(CLASSES))
def test_transformers_dir_loads_in_bertforge(name: str, tmp_path) -> None:
    theirs = hf_model(name, seed=1)
    theirs.save_pretrained(tmp_path)
    ours = getattr(bf, name).from_pretrained(tmp_path)
    assert ours.config.padded_vocab_size == 104  # the 99 saved rows were padded on load
    assert not ours.training
    assert_same_outputs(name, ours, theirs)


@pytest.mark.parametrize("name", list(CLASSES))
def test_bertforge_dir_loads_in_transformers(name: str, tmp_path) -> None:
    ours = our_model(name, seed=2)
    ours.save_pretrained(tmp_path)
    theirs, info = getattr(transformers, name).from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_same_outputs(name, ours, theirs.eval())
    # Round trip back into bertforge through a transformers-written directory.
    theirs.save_pretrained(tmp_path / "again")
    again = getattr(bf, name).from_pretrained(tmp_path / "again")
    for key, value in ours.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


@pytest.mark.parametrize("name", list(CLASSES))
def test_state_dicts_are_interchangeable(name: str) -> None:
    # Without vocabulary padding our state dict is literally the transformers one.
    ours = our_model(name, seed=3, pad_vocab_size_multiple=1)
    theirs = hf_model(name, seed=4)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert_same_outputs(name, ours, theirs)
    # With padding (the default): transformers -> bertforge through load_hf_state_dict ...
    padded = our_model(name, seed=5)
    other = hf_model(name, seed=6)
    report = padded.load_hf_state_dict(other.state_dict())
    assert report.initialized == [] and report.dropped == []
    assert_same_outputs(name, padded, other)
    # ... and bertforge -> transformers through hf_state_dict (tied aliases re-tied by transformers).
    fresh = hf_model(name, seed=7)
    result = fresh.load_state_dict(padded.hf_state_dict(), strict=False)
    assert set(result.missing_keys) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert not result.unexpected_keys
    fresh.tie_weights()
    assert_same_outputs(name, padded, fresh)


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_other_activations_match(act: str, tmp_path) -> None:
    theirs = hf_model("BertForPreTraining", seed=8, hidden_act=act)
    theirs.save_pretrained(tmp_path)
    ours = bf.BertForPreTraining.from_pretrained(tmp_path)
    assert ours.config.hidden_act == act
    assert_same_outputs("BertForPreTraining", ours, theirs)


def test_unpadded_batch_matches_with_sdpa_backend(tmp_path) -> None:
    # No padding -> bertforge passes attn_mask=None to SDPA; compare with transformers' SDPA path.
    theirs = hf_model("BertModel", seed=9)
    theirs.save_pretrained(tmp_path)
    theirs = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    ours = bf.BertModel.from_pretrained(tmp_path)
    ids = torch.randint(1, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = ours(ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        b = theirs(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    assert (a - b).abs().max().item() <= TOL
