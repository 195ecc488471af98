"""``bertforge inspect``: a human look at prepared data.

For a native directory: the manifest in a few lines, then a few instances decoded to tokens with
their segment ids, and one draw of the dynamic masking the loader would apply (for denoising
data: the original and noised text of a few documents, and noise statistics over many draws of
the default noise recipe). For hdf5 shards
(ours or NVIDIA's/Google's): the schema, the row count, and a few rows decoded with their static
masks. Nothing here writes; everything returns a string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertforge.data import native
from bertforge.data.batch import IGNORE_INDEX
from bertforge.data.collate.mlm import MicroBatchMaker, masking_spec
from bertforge.errors import DataError

_NSP_NAMES = {0: "IsNext / in order", 1: "random next / swapped", -1: "no pair objective"}
_HDF5_SUFFIXES = (".hdf5", ".h5")


def inspect_dataset(path: str | Path, num: int = 3, seed: int = 0, *,
                    vocab: str | Path | None = None) -> str:
    """Describe a native ``prepare`` directory, an hdf5 shard, or a directory of hdf5 shards.

    ``num`` instances are drawn at random with ``seed`` (the same seed shows the same ones).
    Token ids are decoded with ``vocab`` if given, else with the tokenizer saved by ``prepare``
    next to the data (``<dir>/tokenizer``), else shown as ids.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory; give a `bertforge prepare` output "
                        "directory or hdf5 shard(s)")
    if path.is_dir() and (path / native.MANIFEST_NAME).is_file():
        manifest = native.read_manifest(path, native_only=False, required=_SHOWN)
        tok = _tokenizer(vocab, [native.manifest_tokenizer(path, manifest, "tokenizer")])
        head = _manifest_summary(path, manifest)
        if manifest["format"] == native.FORMAT_NAME:
            return head + "\n\n" + _native_samples(path, manifest, tok, num, seed)
        files = sorted((path / "train").glob("*.hdf5"))
        return head + "\n\n" + _hdf5_samples(files, tok, num, seed)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in _HDF5_SUFFIXES)
        if not files:
            raise DataError(f"{path}: no manifest.json and no *.hdf5/*.h5 files; give a "
                            "`bertforge prepare` output directory or hdf5 shard(s)")
    else:
        files = [path]
    near = [files[0].parent / "tokenizer", files[0].parent.parent / "tokenizer"]
    return _hdf5_samples(files, _tokenizer(vocab, near), num, seed)


def _tokenizer(vocab: str | Path | None, candidates: Sequence[Path]) -> Any:
    from bertforge.tokenization import load_tokenizer

    if vocab is not None:
        return load_tokenizer(vocab)
    for c in candidates:
        if c.is_dir():
            return load_tokenizer(c)
    return None


# The manifest keys the summary and the masked samples read (every manifest prepare writes
# has them; one written by hand may not).
_SHOWN = ("objective", "max_seq_length", "seed", "vocab_size", "vocab_hash", "do_lower_case",
          "special_ids.pad", "special_ids.mask", "masked_lm_prob", "max_predictions",
          "whole_word_masking", "counts.documents", "counts.sentences", "counts.instances",
          "counts.tokens")


def _manifest_summary(path: Path, m: dict[str, Any]) -> str:
    c = m["counts"]
    lines = [
        f"{path}: {m['format']} v{m['format_version']}, objective {m['objective']}, "
        f"max_seq_length {m['max_seq_length']}, seed {m['seed']}",
        f"  vocab      {m['vocab_size']} tokens, sha256 {m['vocab_hash'][:12]}..., "
        f"{'lower-cased' if m['do_lower_case'] else 'cased'}; special ids {m['special_ids']}",
        ("  noise      drawn at load time (data.noise.* of the pretraining config)"
         if m["objective"] == "denoise" else
         f"  masking    masked_lm_prob {m['masked_lm_prob']}, max_predictions "
         f"{m['max_predictions']}, whole_word_masking {m['whole_word_masking']}"
         + (f", dupe_factor {m.get('dupe_factor', '?')} (static)"
            if m["format"] != native.FORMAT_NAME else " (loader defaults)")),
        f"  totals     {c['documents']:,} documents, {c['sentences']:,} sentences, "
        f"{c['instances']:,} instances, {c['tokens']:,} tokens",
    ]
    for name, s in m["splits"].items():
        instances = s.get("instances", sum(shard["instances"] for shard in s["shards"]))
        tokens = f"{s['tokens']:,} tokens" if "tokens" in s else "tokens not recorded"
        lines.append(f"  {name:<10} {instances:,} instances in {len(s['shards'])} shard(s), "
                     f"{tokens}")
        total = max(1, instances)
        for lo, hi, count in s.get("length_histogram", []):
            bar = "#" * max(1, round(40 * count / total)) if count else ""
            lines.append(f"    len {lo:>4}-{hi:<4} {count:>9,}  {bar}")
    return "\n".join(lines)


def _tokens(tok: Any, ids: Sequence[int]) -> list[str]:
    ids = [int(i) for i in ids]
    return tok.convert_ids_to_tokens(ids) if tok is not None else [str(i) for i in ids]


def _native_samples(path: Path, m: dict[str, Any], tok: Any, num: int, seed: int) -> str:
    def count(split: dict[str, Any]) -> int:
        return split.get("instances", sum(shard["instances"] for shard in split["shards"]))

    splits = m["splits"]
    split = "train" if "train" in splits and count(splits["train"]) else next(
        (s for s, v in splits.items() if count(v)), "train")
    ds = native.NativeDataset(path, split)
    if len(ds) == 0:
        return f"(split {split} holds no instances)"
    picks = np.random.default_rng(seed).choice(len(ds), size=min(num, len(ds)), replace=False)
    if m["objective"] == "denoise":
        return _denoise_samples(ds, split, tok, sorted(int(p) for p in picks), seed)
    out = []
    for i in sorted(int(p) for p in picks):
        item = ds[i]
        words = _tokens(tok, item.tokens)
        n = len(words)
        out.append(f"{split}[{i}]: {n} tokens, A {item.a_length} / B {n - item.a_length}, "
                   f"nsp_label {item.nsp_label} ({_NSP_NAMES.get(item.nsp_label, '?')})")
        out.append("  tokens   " + " ".join(words))
        out.append("  segments " + "".join("0" if k < item.a_length else "1" for k in range(n)))
        ids, positions, labels = _dynamic_mask(ds, m, tok, seed, i)
        out.append(f"  masked   (loader draw, seed {seed}, epoch 0; shown as input(original))")
        out.append("           " + _show_masked(tok, ids, positions, labels))
    return "\n".join(out)


STATISTICS_SAMPLES = 500


def _denoise_samples(ds: native.NativeDataset, split: str, tok: Any, picks: list[int],
                     seed: int) -> str:
    """Original and noised text of ``picks`` (the loader's epoch-0 draws with ``seed`` and the
    default noise recipe), then noise statistics over up to ``STATISTICS_SAMPLES`` documents."""
    from bertforge.data.collate.seq2seq import DenoisingBatchMaker
    from bertforge.data.noise_statistics import noise_statistics
    from bertforge.data.noising import DEFAULT_NOISE, noise_vocab

    if tok is None:
        return "(no tokenizer next to the data: cannot show denoising samples)"
    vocab = noise_vocab(tok)
    maker = DenoisingBatchMaker(ds, seed=seed, spec=DEFAULT_NOISE, vocab=vocab,
                                pad_id=tok.pad_id,
                                max_source_length=1 << 30)

    def text(ids: np.ndarray) -> str:
        return tok.decode([int(i) for i in ids], skip_special_tokens=False)

    recipe = ", ".join(f"{k} {v}" for k, v in vars(DEFAULT_NOISE).items())
    out = [f"noise: the default recipe ({recipe}); loader draw with seed {seed}, epoch 0"]
    for i in picks:
        source, target = maker.pair(i, epoch=0)
        _, ends = ds.get_sentences(i)
        out.append(f"{split}[{i}]: {len(target)} tokens, {len(ends)} sentence(s); noised "
                   f"{len(source)} tokens")
        out.append("  original " + text(target))
        out.append("  noised   " + text(source))
    count = min(len(ds), STATISTICS_SAMPLES)
    rows = np.random.default_rng(seed).choice(len(ds), size=count, replace=False)
    stats = noise_statistics((maker.pair(int(r), epoch=0)[::-1] for r in rows), vocab)
    out.append(f"noise statistics over {count} documents:")
    out += [f"  {k:<18} {v:.4g}" for k, v in stats.items()]
    return "\n".join(out)


def _dynamic_mask(ds: native.NativeDataset, m: dict[str, Any], tok: Any, seed: int,
                  index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The loader's own draw for instance ``index`` in epoch 0 with ``seed``: the masked ids
    (L,), the predicted positions (P,) and the original ids there (P,)."""
    special = m["special_ids"]
    # Whole-word masking needs the vocabulary's "##" flags; without a tokenizer, show plain masks.
    wwm = bool(m.get("whole_word_masking")) and tok is not None
    spec = masking_spec(
        masked_lm_prob=m["masked_lm_prob"], max_predictions=m["max_predictions"],
        whole_word_masking=wwm, is_continuation=tok.is_continuation if wwm else None,
        mask_id=special["mask"], vocab_size=m["vocab_size"], special_ids=list(special.values()),
        pad_id=special["pad"])
    maker = MicroBatchMaker(ds, seed=seed, masking=spec, pad_id=special["pad"],
                            pad_to_multiple_of=1)
    ids, _types, labels, _nsp = maker.dynamic_row(index, epoch=0)
    positions = np.flatnonzero(labels != IGNORE_INDEX)
    return ids, positions, labels[positions]


def _show_masked(tok: Any, ids: np.ndarray, positions: np.ndarray, labels: np.ndarray) -> str:
    words = _tokens(tok, ids)
    originals = dict(zip((int(p) for p in positions), _tokens(tok, labels)))
    return " ".join(f"{w}({originals[k]})" if k in originals else w for k, w in enumerate(words))


def _hdf5_samples(files: list[Path], tok: Any, num: int, seed: int) -> str:
    import h5py

    from bertforge.data.hdf5 import Hdf5Dataset

    if not files:
        return "(no hdf5 shards)"
    ds = Hdf5Dataset(files)
    lines = [f"{len(files)} hdf5 file(s), {len(ds):,} rows; schema of {files[0]}:"]
    try:
        with h5py.File(files[0], "r") as f:
            for name, d in f.items():
                lines.append(f"  {name:<22} {str(d.dtype):<6} {tuple(d.shape)}")
    except OSError as e:
        raise DataError(f"{files[0]}: cannot open as hdf5 ({e})") from e
    if len(ds) == 0:
        return "\n".join(lines + ["(no rows)"])
    picks = np.random.default_rng(seed).choice(len(ds), size=min(num, len(ds)), replace=False)
    for i in sorted(int(p) for p in picks):
        ids, types, labels, nsp = ds.get_static(i)
        where = np.flatnonzero(labels != IGNORE_INDEX)
        lines.append(f"row {i}: {len(ids)} tokens, {len(where)} masked, next_sentence_label {nsp} "
                     f"({_NSP_NAMES.get(nsp, '?')})")
        lines.append("  tokens   " + _show_masked(tok, ids, where, labels[where]))
        lines.append("  segments " + "".join(str(int(t)) for t in types))
    return "\n".join(lines)
