"""``bertforge demo`` (``make demo``): the whole journey on the bundled sample corpus, on a CPU, in a few minutes.

corpus (Python standard-library docstrings) -> WordPiece vocab -> prepared shards -> a tiny BERT
pretrained with LAMB -> checkpoint reloaded by bertforge (and by Hugging Face transformers when
installed) -> masked-word predictions -> SQuAD-style fine-tuning on questions built from the
same library's docstrings, scored with exact match and F1 -> the same corpus as BART denoising
data (byte-level BPE, sentence boundaries) -> a tiny BART pretrained by denoising -> a held-out
document noised and reconstructed by beam search. Each stage is the same public function the CLI
calls.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from bertforge.errors import ConfigError
from bertforge.recipes import resolve_recipe

MARKER = ".bertforge-demo"
"""The file that marks a folder as a demo's workdir (a later demo may replace its runs)."""
RUNS = ("run", "qa-run", "bart/run")
"""The training runs a demo writes; a new demo in the same workdir trains them afresh."""

SENTENCES = [
    "Return a new [MASK] containing the items of the iterable.",
    "Raise an [MASK] if the file does not exist.",
    "The default [MASK] is None.",
]


def _stage(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def predict_masked(model, tokenizer, sentence: str, top_k: int = 5) -> list[str]:
    """Top-k tokens for the first [MASK] in ``sentence``."""
    ids = tokenizer.encode(sentence)
    pos = ids.index(tokenizer.mask_id)
    batch = torch.tensor([ids])
    model.eval()
    with torch.no_grad():
        out = model(batch, attention_mask=torch.ones_like(batch))
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits
    best = logits[0, pos].topk(top_k).indices.tolist()
    return tokenizer.convert_ids_to_tokens(best)


def claim_workdir(workdir: Path) -> list[Path]:
    """Make ``workdir`` the demo's and return the earlier runs this demo replaces.

    A new or empty folder gets the marker. A folder an earlier demo made keeps its corpus,
    vocabularies and prepared data (rebuilt or reused, they come out the same) and loses its
    training runs, so that ``make demo`` run twice trains twice rather than stopping at the
    first run's checkpoints. Any other folder is refused: the demo deletes only what it made.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / MARKER
    if not marker.is_file():
        if any(workdir.iterdir()):
            raise ConfigError(f"--workdir {workdir} is not empty and was not made by `bertforge "
                              "demo`; give a new or empty folder")
        marker.write_text("bertforge demo workdir: its runs are replaced by the next demo\n")
    earlier = [workdir / run for run in RUNS if (workdir / run).exists()]
    for run in earlier:
        shutil.rmtree(run)
    return earlier


def run_demo(workdir: Path, steps: int = 300, bart_steps: int = 300) -> dict:
    from bertforge.config import PretrainConfig, load_config
    from bertforge.data.prepare import prepare
    from bertforge.models import BertForPreTraining
    from bertforge.demo.corpus import build_sample_corpus
    from bertforge.tokenization import BertTokenizer
    from bertforge.tokenization.training import train_wordpiece
    from bertforge.commands.train import pretrain

    t0 = time.perf_counter()
    if claim_workdir(workdir):
        print(f"{workdir} holds an earlier demo: its training runs are replaced, its data reused")
    _stage("1. sample corpus (docstrings of Python's standard library, PSF license)")
    corpus = build_sample_corpus(workdir / "corpus" / "stdlib_docstrings.txt")
    print(f"{corpus} ({corpus.stat().st_size / 1e6:.1f} MB)")

    _stage("2. WordPiece vocabulary")
    vocab = workdir / "vocab" / "vocab.txt"
    print(train_wordpiece([str(corpus)], vocab_size=6000, output=vocab).summary())

    _stage("3. prepare pretraining data (NSP pairs, token ids; masks drawn at load time)")
    data = workdir / "data"
    print(prepare([str(corpus)], vocab=vocab, output=data, max_seq_length=64,
                  validation_fraction=0.05, workers=2, seed=1).summary())

    _stage(f"4. pretrain a tiny BERT on the CPU ({steps} LAMB steps)")
    cfg = load_config(PretrainConfig, resolve_recipe("debug/tiny-cpu"), [
        f"--data.path={data}", f"--output_dir={workdir / 'run'}", f"--train.max_steps={steps}",
        "--resume=none"])
    result = pretrain(cfg)
    history = result.history
    first, last = history[0]["loss"], history[-1]["loss"]
    print(f"loss {first:.3f} -> {last:.3f}")

    _stage("5. reload the checkpoint and fill in masked words "
           "(a 2-layer model after a minute of CPU: expect mostly frequent words)")
    ckpt = result.final_checkpoint
    model = BertForPreTraining.from_pretrained(ckpt)
    tokenizer = BertTokenizer.from_pretrained(ckpt)
    for sentence in SENTENCES:
        print(f"{sentence}\n    -> {', '.join(predict_masked(model, tokenizer, sentence))}")
    hf_status = _check_transformers(ckpt, model, tokenizer)
    print(hf_status)

    _stage("6. fine-tune it for question answering (SQuAD format; questions built from "
           "'Return ...' docstrings of the standard library)")
    qa = _finetune_qa(workdir, ckpt)
    print(f"exact match {qa['exact_match']:.1f}, F1 {qa['f1']:.1f} on {qa['questions']} held-out "
          "questions")

    _stage(f"7. BART: byte-level BPE, denoising data, a tiny BART pretrained on the CPU "
           f"({bart_steps} AdamW steps), and a noised document reconstructed by beam search "
           "(a few hundred CPU steps teach it frequent words, not yet copying: expect those)")
    bart = _bart(workdir, corpus, bart_steps)

    _stage("summary")
    summary = {
        "corpus_mb": round(corpus.stat().st_size / 1e6, 2), "vocab": str(vocab),
        "data": str(data), "checkpoint": str(ckpt), "steps": result.step,
        "loss_first": round(first, 4), "loss_last": round(last, 4),
        "validation": ", ".join(f"{k} {v:.4f}" for k, v in result.validation.items()) or "none",
        "transformers": hf_status,
        "qa": f"exact match {qa['exact_match']:.1f}, F1 {qa['f1']:.1f}",
        "qa_model": str(workdir / "qa-run"),
        "bart": f"loss {bart['loss_first']:.3f} -> {bart['loss_last']:.3f}, validation loss "
                f"{bart['val_loss']:.3f}; {bart['transformers']}",
        "bart_model": str(bart["checkpoint"]),
        "minutes": round((time.perf_counter() - t0) / 60, 1),
    }
    for key, value in summary.items():
        print(f"  {key:<12} {value}")
    print(next_steps(workdir / "qa-run"))
    return summary


def next_steps(qa_model: Path) -> str:
    """What to try after the demo, as commands that work on what it made."""
    return "\n".join([
        "", "next:",
        f"  bertforge predict qa --model {qa_model} --question \"What does it return?\" "
        "--context \"Return a new list containing the items of the iterable.\"",
        f"  bertforge serve --model {qa_model}        # then open http://127.0.0.1:8000",
        "  make demo                                  # again: trains afresh, reuses the data",
        "  real data and models: README.md (Quick start, Fine-tuning) and docs/"])


def _finetune_qa(workdir: Path, checkpoint: Path) -> dict:
    """SQuAD-style fine-tuning of the pretrained checkpoint on the stdlib QA sample."""
    from bertforge.config import FinetuneConfig, load_config
    from bertforge.demo.qa_data import build_sample_qa
    from bertforge.commands.train import finetune

    train, dev, n_train, n_dev = build_sample_qa(workdir / "qa")
    print(f"{train} ({n_train} questions), {dev} ({n_dev} questions)")
    # The demo pretrains at 64 tokens, so fine-tuning keeps to the positions it has learned.
    cfg = load_config(FinetuneConfig, resolve_recipe("finetune/debug-cpu"), [
        "--task=squad", f"--model={checkpoint}", f"--data.train={train}",
        f"--data.validation={dev}", f"--output_dir={workdir / 'qa-run'}", "--resume=none",
        "--data.max_seq_length=64", "--data.doc_stride=32", "--data.max_query_length=16",
        "--train.epochs=3", "--optim.lr=3e-4"])
    return {**finetune(cfg).validation, "questions": n_dev}


def _bart(workdir: Path, corpus: Path, steps: int) -> dict:
    """BPE vocab, denoising data, a tiny BART pretrained by denoising, and one reconstruction."""
    from bertforge.config import PretrainConfig, load_config
    from bertforge.data.native import NativeDataset
    from bertforge.data.prepare import prepare
    from bertforge.models.generation import GenerationConfig, generate
    from bertforge.models.bart import BartForConditionalGeneration
    from bertforge.data.collate.seq2seq import DenoisingBatchMaker
    from bertforge.data.noising import noise_vocab
    from bertforge.commands.train import pretrain
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.training import train_bpe

    root = workdir / "bart"
    print(train_bpe([str(corpus)], vocab_size=4000, output=root / "bpe").summary())
    data = root / "data"
    print(prepare([str(corpus)], vocab=root / "bpe", output=data, objective="denoise",
                  max_seq_length=128, validation_fraction=0.05, workers=2, seed=1).summary())
    cfg = load_config(PretrainConfig, resolve_recipe("debug/bart-tiny-cpu"), [
        f"--data.path={data}", f"--output_dir={root / 'run'}", f"--train.max_steps={steps}",
        "--resume=none"])
    result = pretrain(cfg)
    ckpt = result.final_checkpoint
    model = BartForConditionalGeneration.from_pretrained(ckpt)
    tok = load_tokenizer(ckpt)
    # A held-out document, noised as in training (the data's validation split, seed 1).
    held_out = NativeDataset(data, "validation")
    noise = DenoisingBatchMaker(held_out, seed=1, spec=cfg.data.noise.spec(),
                                vocab=noise_vocab(tok), pad_id=tok.pad_id,
                                max_source_length=128)
    source, target = noise.pair(0, epoch=0)
    ids = torch.from_numpy(source)[None]
    # At least half the original's length, or a model this young answers with </s> at once.
    settings = GenerationConfig.from_model_config(model.config, num_beams=4,
                                                  min_length=len(target) // 2,
                                                  max_length=len(target) + 8,
                                                  no_repeat_ngram_size=3)
    out = generate(model, ids, torch.ones_like(ids), settings)
    print("original      " + tok.decode(target.tolist()))
    print("noised input  " + tok.decode(source.tolist(), skip_special_tokens=False))
    print("reconstructed " + tok.decode(out[0].tolist()))
    losses = [r["loss"] for r in result.history]
    return {"loss_first": losses[0], "loss_last": losses[-1], "checkpoint": ckpt,
            "val_loss": result.validation.get("val_loss", float("nan")),
            "transformers": _check_transformers_bart(ckpt, model, ids, out)}


def _check_transformers_bart(ckpt: Path, model, ids: torch.Tensor, decoded: torch.Tensor) -> str:
    """Load the BART checkpoint with transformers (a Pre-LN BART is an mBART there)."""
    try:
        import transformers
    except ImportError:
        return "transformers not installed: skipped loading the checkpoint there"
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(ckpt)).eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids, decoder_input_ids=decoded).logits
        ours = model(ids, None, decoded).logits
    return (f"transformers loaded it as {type(hf).__name__}: max |logit difference| = "
            f"{(ours - theirs).abs().max().item():.2e}")


def _check_transformers(ckpt: Path, model, tokenizer) -> str:
    """Load the checkpoint with Hugging Face transformers and compare logits (if installed)."""
    try:
        import transformers
    except ImportError:
        return "transformers not installed: skipped loading the checkpoint there"
    hf = transformers.BertForPreTraining.from_pretrained(str(ckpt)).eval()
    ids = torch.tensor([tokenizer.encode(SENTENCES[0])])
    with torch.no_grad():
        ours = model(ids).mlm_logits
        theirs = hf(input_ids=ids).prediction_logits
    diff = (ours - theirs).abs().max().item()
    return (f"transformers {transformers.__version__} loaded {ckpt.name}: "
            f"max |logit difference| = {diff:.2e}")
