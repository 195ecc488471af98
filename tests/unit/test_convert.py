"""NVIDIA DeepLearningExamples checkpoints -> Hugging Face directory, checked in transformers."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from bertforge.models.convert import convert_nvidia_checkpoint
from bertforge.errors import CheckpointError, ConfigError
from bertforge.models import BertConfig, BertForPreTraining, BertForQuestionAnswering

NVIDIA_CONFIG = {  # the keys NVIDIA's bert_config.json has; vocab_size is the real (unpadded) size
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 37, "max_position_embeddings": 16, "num_attention_heads": 4,
    "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 99,
}


def spread_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def nvidia_state_dict(model: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """Our weights in NVIDIA's layout: dense_act names, vocab padded to 8 with junk, wrapper prefix."""
    gen = torch.Generator().manual_seed(99)
    out = {}
    for key, value in model.state_dict().items():
        if key == "cls.predictions.decoder.bias":
            continue  # NVIDIA's decoder has no bias of its own
        for module in ("intermediate.dense.", "pooler.dense.", "transform.dense."):
            key = key.replace(module, module.replace("dense.", "dense_act."))
        if value.shape[0] == 104:  # padded rows: real ones, then NVIDIA's padding (never trained)
            value = torch.cat([value[:99], torch.randn((5, *value.shape[1:]), generator=gen)])
        out[prefix + key] = value.clone()
    return out


@pytest.fixture
def nvidia_files(tmp_path):
    model = spread_(BertForPreTraining(BertConfig(**{k: NVIDIA_CONFIG[k] for k in NVIDIA_CONFIG})), seed=0)
    state = nvidia_state_dict(model, "module.")
    assert state["module.bert.embeddings.word_embeddings.weight"].shape == (104, 32)
    assert "module.bert.encoder.layer.0.intermediate.dense_act.weight" in state
    ckpt = tmp_path / "ckpt_7038.pt"
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": [{"lr": 6e-3}]},
                "master params": [torch.zeros(3)], "files": ["shard_0.hdf5"], "epoch": 1}, ckpt)
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(NVIDIA_CONFIG))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(99)))
    return model, ckpt, config, vocab


def batch():
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 99, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    return ids * mask, mask, types


def test_pretraining_checkpoint_converts_and_loads_in_transformers(nvidia_files, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    model, ckpt, config, vocab = nvidia_files
    out = convert_nvidia_checkpoint(ckpt, config, tmp_path / "hf", vocab=vocab)
    assert (out / "vocab.txt").read_text() == vocab.read_text()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True,
                                                                    attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, mask, types = batch()
    valid = mask.bool()
    with torch.no_grad():
        ref = model(ids, mask, types)
        hf = theirs.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types)
        again = BertForPreTraining.from_pretrained(out)(ids, mask, types)
    assert (hf.prediction_logits[valid] - ref.mlm_logits[valid]).abs().max().item() <= 1e-5
    assert (hf.seq_relationship_logits - ref.nsp_logits).abs().max().item() <= 1e-5
    assert torch.equal(again.mlm_logits, ref.mlm_logits)


def test_bare_squad_state_dict_with_compile_prefix(tmp_path) -> None:
    qa = spread_(BertForQuestionAnswering(BertConfig(**NVIDIA_CONFIG)), seed=1)
    ckpt = tmp_path / "pytorch_model.bin"
    torch.save(nvidia_state_dict(qa, "_orig_mod."), ckpt)
    out = convert_nvidia_checkpoint(ckpt, _write_config(tmp_path), tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    ids, mask, types = batch()
    with torch.no_grad():
        a, b = qa(ids, mask, types), BertForQuestionAnswering.from_pretrained(out)(ids, mask, types)
    assert torch.equal(a.start_logits, b.start_logits) and torch.equal(a.end_logits, b.end_logits)


def _write_config(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(NVIDIA_CONFIG))
    return path


def test_pickled_objects_need_trust(nvidia_files, tmp_path) -> None:
    model, _, config, _ = nvidia_files
    ckpt = tmp_path / "with_args.pt"
    torch.save({"model": nvidia_state_dict(model, ""), "args": argparse.Namespace(max_steps=7038)}, ckpt)
    with pytest.raises(CheckpointError, match=r"with_args.pt was refused: it is a pickle.*--trust-pickle"):
        convert_nvidia_checkpoint(ckpt, config, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    out = convert_nvidia_checkpoint(ckpt, config, tmp_path / "hf", trust_pickle=True)
    assert (out / "model.safetensors").is_file()


def test_user_errors(nvidia_files, tmp_path) -> None:
    _, ckpt, config, vocab = nvidia_files
    with pytest.raises(CheckpointError, match=r"(?s)cannot load .*ckpt_7038.pt into BertForPreTraining.*"
                                              r"word_embeddings.weight: checkpoint \[104, 32\], model expects \[30528, 128\]"):
        convert_nvidia_checkpoint(ckpt, "bert-tiny", tmp_path / "hf")
    short_vocab = tmp_path / "short.txt"
    short_vocab.write_text("a\nb\n")
    with pytest.raises(ConfigError, match="short.txt has 2 tokens but the model config has vocab_size=99"):
        convert_nvidia_checkpoint(ckpt, config, tmp_path / "hf", vocab=short_vocab)
    with pytest.raises(ConfigError, match="Did you mean 'bert-large-uncased'"):
        convert_nvidia_checkpoint(ckpt, "bert-large-uncase", tmp_path / "hf")
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_nvidia_checkpoint(tmp_path / "missing.pt", config, tmp_path / "hf")
    not_weights = tmp_path / "notes.pt"
    torch.save({"step": 3, "note": "hello"}, not_weights)
    with pytest.raises(CheckpointError, match=r"not an NVIDIA BERT checkpoint.*keys \['step', 'note'\]"):
        convert_nvidia_checkpoint(not_weights, config, tmp_path / "hf")
