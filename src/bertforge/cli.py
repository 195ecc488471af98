"""The ``bertforge`` command: one subcommand per user journey, argument handling only.

Each handler imports its back end lazily (so ``--help`` stays instant) and calls one function.
``UserError`` becomes ``error: <message>`` and exit status 2, ``RunError`` the same with status 1,
a stop signal (SIGTERM/SIGUSR1 outside the train loop) ``stopped by SIGTERM`` and 128 + its
number; never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Sequence

from bertforge.errors import RunError, UserError, os_error_text
from bertforge.core.signals import Stopped, raise_on_stop

Handler = Callable[[argparse.Namespace, list], int]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show every option's default and keep the hand-written layout of epilogs."""


def _add_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="Files, directories (read recursively) or globs; .gz/.bz2/.xz are read "
                        "transparently.")
    p.add_argument("--text-field", default="text",
                   help="JSON Lines only: the field holding each document's text.")
    p.add_argument("--input-format", default="auto",
                   choices=["auto", "sentences", "paragraphs", "jsonl", "wiki"],
                   help="auto: by extension (.txt/.md: a blank line ends a document and each line "
                        "is split into sentences; .jsonl: JSON Lines; .xml: Wikipedia dump). "
                        "sentences: one sentence per line. paragraphs: blank-line-separated blocks.")


# --- handlers ---------------------------------------------------------------------------------


def _vocab(args: argparse.Namespace, extra: list) -> int:
    from bertforge.tokenization.training import train_bpe, train_wordpiece

    if args.type == "bpe":
        if args.cased:
            raise UserError("--cased applies to WordPiece only: byte-level BPE always keeps case")
        report = train_bpe(args.input, vocab_size=args.vocab_size, output=Path(args.output),
                           min_frequency=args.min_frequency, input_format=args.input_format,
                           text_field=args.text_field)
    else:
        report = train_wordpiece(args.input, vocab_size=args.vocab_size, output=Path(args.output),
                                 lowercase=not args.cased, min_frequency=args.min_frequency,
                                 input_format=args.input_format, text_field=args.text_field)
    print(report.summary())
    return 0


def _prepare(args: argparse.Namespace, extra: list) -> int:
    from bertforge.data.prepare import prepare

    report = prepare(
        args.input, vocab=Path(args.vocab), output=Path(args.output),
        max_seq_length=args.max_seq_length, max_predictions=args.max_predictions,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        objective=args.objective, whole_word_masking=args.whole_word_masking,
        dupe_factor=args.dupe_factor, validation_fraction=args.validation_fraction,
        workers=args.workers, seed=args.seed, fmt=args.format, input_format=args.input_format,
        text_field=args.text_field,
        overwrite=args.overwrite)
    print(report.summary())
    return 0


def _inspect(args: argparse.Namespace, extra: list) -> int:
    from bertforge.data.inspect import inspect_dataset

    print(inspect_dataset(Path(args.path), num=args.num, seed=args.seed))
    return 0


def _convert(args: argparse.Namespace, extra: list) -> int:
    from bertforge.models.convert import convert_nvidia_checkpoint

    out = convert_nvidia_checkpoint(Path(args.checkpoint), args.config, Path(args.output),
                                    vocab=Path(args.vocab) if args.vocab else None,
                                    trust_pickle=args.trust_pickle)
    print(f"wrote Hugging Face model directory {out}")
    return 0


def _run_config(cls: type, args: argparse.Namespace, extra: list):
    """``cls`` from the recipe or file of ``--config`` and the ``--key=value`` overrides; loaded
    before torch is imported, so config errors are instant."""
    from bertforge.config import load_config
    from bertforge.recipes import resolve_recipe

    return load_config(cls, resolve_recipe(args.config) if args.config else None, extra)


def _pretrain(args: argparse.Namespace, extra: list) -> int:
    from bertforge.config import PretrainConfig

    cfg = _run_config(PretrainConfig, args, extra)
    from bertforge.tasks.pretrain import benchmark_pretraining, pretrain

    benchmark_pretraining(cfg) if args.benchmark else pretrain(cfg)
    return 0


def _finetune(args: argparse.Namespace, extra: list) -> int:
    from bertforge.config import FinetuneConfig

    cfg = _run_config(FinetuneConfig, args, extra)
    from bertforge.tasks.finetune import benchmark_finetuning, finetune, finetune_seeds

    if args.benchmark:
        benchmark_finetuning(cfg)
    elif args.seeds:
        finetune_seeds(cfg, args.seeds)
    else:
        finetune(cfg)
    return 0


def _evaluate(args: argparse.Namespace, extra: list) -> int:
    import json

    if args.what == "summarization":
        from bertforge.metrics.rouge import evaluate_summarization_files

        if not args.references:
            raise UserError("evaluate summarization needs --references (the reference summaries)")
        scores = evaluate_summarization_files(Path(args.predictions), Path(args.references),
                                              prediction_field=args.prediction_field,
                                              reference_field=args.reference_field)
    else:
        from bertforge.metrics.squad import evaluate_squad_files

        if not args.data:
            raise UserError("evaluate squad needs --data (the SQuAD dev JSON)")
        scores = evaluate_squad_files(Path(args.data), Path(args.predictions),
                                      Path(args.na_probs) if args.na_probs else None)
    print(json.dumps(scores, indent=2))
    return 0


def _generate(args: argparse.Namespace, extra: list) -> int:
    from bertforge.inference.generate import generate_file

    overrides = {k: getattr(args, k) for k in ("num_beams", "length_penalty", "max_length",
                                               "min_length", "no_repeat_ngram_size")
                 if getattr(args, k) is not None}
    if args.early_stopping is not None:
        overrides["early_stopping"] = {"true": True, "false": False}.get(args.early_stopping,
                                                                         args.early_stopping)
    out = generate_file(Path(args.model), Path(args.input), Path(args.output),
                        overrides=overrides, batch_size=args.batch_size, device=args.device,
                        text_field=args.text_field, max_source_length=args.max_source_length)
    print(f"wrote {out}")
    return 0


def _predict(args: argparse.Namespace, extra: list) -> int:
    if args.mode is None:
        given = [f for f in ("question", "context", "context_file", "text") if getattr(args, f)]
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} needs a MODE, e.g. `bertforge "
                            "predict qa --model DIR --question Q --context C`")
        if not (args.data and args.output):
            raise UserError("predict needs a MODE (qa, classify, tag, fill-mask, summarize, "
                            "embed) or --data and --output to predict a whole file")
        from bertforge.inference.predict import predict_file

        out = predict_file(Path(args.model), Path(args.data), Path(args.output), extra)
        print(f"wrote predictions to {out}")
        return 0
    if extra or args.data or args.output:
        wrong = " ".join(extra) or ("--data" if args.data else "--output")
        raise UserError(f"predict {args.mode} does not take {wrong}: --data, --output and "
                        "--key=value settings are for predicting a whole file (no MODE)")
    from bertforge.inference.interactive import run_predict

    options = {k: getattr(args, k) for k in ("doc_stride", "max_query_length", "pooling")
               if getattr(args, k) is not None}
    fields = {k: getattr(args, k) for k in ("top_k", "num_beams", "max_length", "min_length",
                                            "length_penalty", "no_repeat_ngram_size")
              if getattr(args, k) is not None}
    return run_predict(args.mode, args.model, question=args.question, context=args.context,
                       context_file=args.context_file, texts=args.text or (),
                       as_json=args.json, device=args.device, precision=args.precision,
                       max_length=args.max_seq_length, truncation=args.truncation,
                       options=options, fields=fields, stdin=sys.stdin, stdout=sys.stdout,
                       stderr=sys.stderr)


def _serve(args: argparse.Namespace, extra: list) -> int:
    from bertforge.serve import serve

    return serve(Path(args.model), host=args.host, port=args.port, task=args.task,
                 backend=args.backend, api_key=args.api_key,
                 max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms,
                 max_batch_items=args.max_batch_items, max_body_bytes=args.max_body_bytes,
                 max_text_chars=args.max_text_chars, truncation=args.truncation,
                 device=args.device, embeddings=not args.no_embeddings,
                 log_level=args.log_level)


def _export(args: argparse.Namespace, extra: list) -> int:
    from bertforge.export import export_onnx

    report = export_onnx(Path(args.model), Path(args.output), opset=args.opset,
                         quantize=args.quantize, sample=Path(args.sample) if args.sample else None,
                         triton=args.triton, atol=args.atol, exporter=args.exporter)
    print(report.summary())
    return 0


def _seed_list(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text}")
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected seeds >= 0, got {text}")
    return seeds


def _plan(args: argparse.Namespace, extra: list) -> int:
    from bertforge.train.plan import plan_batch

    print(plan_batch(model=args.model, seq_len=args.seq_len, gpus=args.gpus,
                     gpu_memory_gib=args.gpu_memory, global_batch_size=args.global_batch_size,
                     precision=args.precision).summary())
    return 0


def _demo(args: argparse.Namespace, extra: list) -> int:
    from bertforge.demo import run_demo

    run_demo(Path(args.workdir), steps=args.steps, bart_steps=args.bart_steps)
    return 0


# --- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertforge", formatter_class=_Formatter,
        description="BERT and BART pretraining and fine-tuning with Hugging Face checkpoints "
                    "natively.")
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Handler, help: str, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter, **kw)
        p.set_defaults(handler=handler)
        return p

    p = add("vocab", _vocab, "Train a vocabulary: WordPiece for BERT (vocab.txt + tokenizer.json) "
            "or byte-level BPE for BART (a tokenizer directory).")
    _add_input_args(p)
    p.add_argument("--type", choices=["wordpiece", "bpe"], default="wordpiece",
                   help="wordpiece (BERT) or bpe (BART's byte-level BPE, specials <s> <pad> </s> "
                        "<unk> <mask>).")
    p.add_argument("--vocab-size", type=_positive_int, default=30522,
                   help="Target vocabulary size (BART's is 50265).")
    p.add_argument("--output", required=True,
                   help="wordpiece: vocab.txt to write (tokenizer.json goes beside it); bpe: a "
                        "directory for tokenizer.json, vocab.json, merges.txt and configs.")
    p.add_argument("--cased", action="store_true",
                   help="WordPiece: keep case and accents (default: lower-case and strip accents, "
                        "as BERT uncased). BPE always keeps case.")
    p.add_argument("--min-frequency", type=_positive_int, default=2, help="Minimum count of a merged piece.")

    p = add("prepare", _prepare, "Turn a corpus into pretraining data (sentence pairs, shards).")
    _add_input_args(p)
    p.add_argument("--vocab", required=True,
                   help="vocab.txt, tokenizer.json or a model/tokenizer directory (WordPiece or BPE).")
    p.add_argument("--output", required=True, help="Output directory.")
    p.add_argument("--max-seq-length", type=_positive_int, default=128, help="Tokens per sequence.")
    p.add_argument("--max-predictions", type=_positive_int, default=20,
                   help="Masked tokens per sequence at most (stored for the loader; used by hdf5).")
    p.add_argument("--masked-lm-prob", type=float, default=0.15, help="Fraction of tokens masked.")
    p.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="Probability of a shorter target length (as Google's BERT).")
    p.add_argument("--objective", choices=["nsp", "sop", "none", "denoise"], default="nsp",
                   help="nsp / sop: BERT sentence pairs (next-sentence, sentence-order); none: "
                        "packed text; denoise: packed documents with sentence boundaries for BART "
                        "(noise is drawn at load time; native format only).")
    p.add_argument("--whole-word-masking", action="store_true", help="Mask whole words only.")
    p.add_argument("--dupe-factor", type=_positive_int, default=5,
                   help="hdf5 only: copies of the data with different static masks.")
    p.add_argument("--validation-fraction", type=float, default=0.01,
                   help="Fraction of documents held out for validation.")
    p.add_argument("--workers", type=_positive_int, default=1, help="Worker processes.")
    p.add_argument("--seed", type=int, default=12345, help="Seed (output is identical for a seed).")
    p.add_argument("--format", choices=["native", "hdf5"], default="native",
                   help="native: token ids, masks drawn at load time; hdf5: NVIDIA/Google static masks.")
    p.add_argument("--overwrite", action="store_true",
                   help="Replace an existing output made with different settings.")

    p = add("inspect", _inspect, "Show a prepared dataset's manifest and a few decoded instances.")
    p.add_argument("path", help="A `prepare` output directory, or hdf5 file(s)/directory.")
    p.add_argument("--num", type=_positive_int, default=3, help="Instances to show.")
    p.add_argument("--seed", type=int, default=0, help="Which instances / masks to draw.")

    p = add("convert", _convert, "Convert an NVIDIA DeepLearningExamples BERT checkpoint to "
            "Hugging Face format.")
    p.add_argument("--checkpoint", required=True, help="NVIDIA .pt checkpoint.")
    p.add_argument("--config", required=True, help="Their bert_config.json, or a preset name.")
    p.add_argument("--output", required=True, help="Output model directory.")
    p.add_argument("--vocab", default=None, help="vocab.txt to ship with the model.")
    p.add_argument("--trust-pickle", action="store_true",
                   help="Allow full pickle loading (only for checkpoints you trust).")

    from bertforge.config import PretrainConfig, describe
    from bertforge.recipes import RECIPES_DIR, list_recipes

    p = add("pretrain", _pretrain, "Pretrain BERT (MLM + NSP) or BART (denoising) on prepared "
            "data.",
            epilog="config keys (set in the YAML file or as --key=value):\n"
                   + "\n".join(describe(PretrainConfig))
                   + f"\n\nrecipes (--config NAME, folder optional; copy one from {RECIPES_DIR} "
                     "to edit it):\n"
                   + "\n".join(f"  {name}" for name in list_recipes("pretrain", "debug")))
    p.add_argument("--config", default=None,
                   help="A recipe name (see below) or a YAML file.")
    p.add_argument("--benchmark", action="store_true",
                   help="Warm up, time benchmark.steps steps, report sequences/s, MFU and memory; "
                        "no checkpoints.")

    from bertforge.config import FinetuneConfig

    p = add("finetune", _finetune, "Fine-tune and evaluate on SQuAD, GLUE, your own "
            "classification data, SWAG, token classification or summarization (BART).",
            epilog="config keys (set in the YAML file or as --key=value):\n"
                   + "\n".join(describe(FinetuneConfig))
                   + "\n\nrecipes (--config NAME):\n"
                   + "\n".join(f"  {name}" for name in list_recipes("finetune")))
    p.add_argument("--config", default=None, help="A recipe name (see below) or a YAML file.")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...",
                   help="Run once per seed (output_dir/seed-N) and report each and the median.")
    p.add_argument("--benchmark", action="store_true",
                   help="Time benchmark.steps training steps; report sequences/s and MFU.")

    p = add("evaluate", _evaluate, "Score predictions: SQuAD v1.1/v2.0 (official metrics) or "
            "summaries (ROUGE-1/2/L/Lsum).")
    p.add_argument("what", choices=["squad", "summarization"], help="What to evaluate.")
    p.add_argument("--predictions", required=True,
                   help="squad: predictions.json (question id -> answer); summarization: JSON "
                        "Lines with id and summary (or prediction), or a .txt, one per line.")
    p.add_argument("--data", default=None, help="squad: the SQuAD dev JSON (v1.1 or v2.0).")
    p.add_argument("--na-probs", default=None,
                   help="squad v2.0: null_odds.json (no-answer scores) for the threshold search.")
    p.add_argument("--references", default=None,
                   help="summarization: reference summaries (JSONL/CSV/TSV, CNN/DailyMail story "
                        "directory, or .txt one per line); matched by id when both have ids.")
    p.add_argument("--prediction-field", default=None,
                   help="summarization: the predictions' text field (default: summary/prediction).")
    p.add_argument("--reference-field", default=None,
                   help="summarization: the references' field (default: detected; a list field "
                        "gives several references per example).")

    p = add("generate", _generate, "Generate with a BART model (batch summarization), using its "
            "generation_config.json unless overridden.")
    p.add_argument("--model", required=True, help="A BART model directory (e.g. from "
                   "`bertforge finetune` with task: summarization).")
    p.add_argument("--input", required=True,
                   help="JSONL/CSV/TSV with a text column (article, document, text, ...), a "
                        "CNN/DailyMail story directory, or a .txt with one text per line.")
    p.add_argument("--output", required=True, help="JSON Lines to write: {id, summary} per text.")
    p.add_argument("--text-field", default=None, help="The input's text column (default: detected).")
    p.add_argument("--batch-size", type=_positive_int, default=8, help="Texts per batch.")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    p.add_argument("--max-source-length", type=_positive_int, default=None,
                   help="Input tokens kept per text (default: the model's positions).")
    p.add_argument("--num-beams", type=_positive_int, default=None, help="Beams (1 = greedy).")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="Beam score = log-prob / length ** length_penalty.")
    p.add_argument("--max-length", type=_positive_int, default=None,
                   help="Longest output in tokens (the decoder start token included).")
    p.add_argument("--min-length", type=int, default=None, help="Shortest output in tokens.")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None,
                   help="Never repeat an n-gram of this size (0 = off).")
    p.add_argument("--early-stopping", choices=["true", "false", "never"], default=None,
                   help="Beam search stopping rule (transformers' meaning).")

    from bertforge.inference.interactive import MODES

    p = add("predict", _predict, "Predict with a model. With a MODE: answer a question or "
            "label texts given as options or read from stdin, one per line. Without: predict a "
            "whole file with the fine-tuning task's reader (--data, --output; extra "
            "--key=value options are fine-tuning config keys, e.g. --eval.batch_size=128).")
    p.add_argument("mode", nargs="?", choices=list(MODES), default=None,
                   help="qa: answer questions about a passage; classify: label names and "
                        "scores; tag: word tags; fill-mask: tokens for [MASK] (<mask> for "
                        "BART); summarize: BART summaries; embed: text vectors. Omit to "
                        "predict a file.")
    p.add_argument("--model", required=True, help="A model directory (e.g. written by "
                   "`bertforge finetune`); its config.json says the task.")
    p.add_argument("--data", default=None,
                   help="No MODE: SQuAD JSON / JSONL questions, or TSV/CSV/JSONL sentences, or "
                        "CoNLL/JSONL tokens, as the model's task reads them.")
    p.add_argument("--output", default=None,
                   help="No MODE: file to write (SQuAD: id -> answer JSON; others: JSON Lines).")
    p.add_argument("--question", default=None,
                   help="qa: the question; without it questions are read from stdin, one a line.")
    p.add_argument("--context", default=None, help="qa: the passage to answer from.")
    p.add_argument("--context-file", default=None, help="qa: a UTF-8 file holding the passage.")
    p.add_argument("--text", action="append", default=None,
                   help="Other modes: an input text (repeat for more); without it texts are "
                        "read from stdin, one a line.")
    p.add_argument("--json", action="store_true",
                   help="Print one JSON object per input (JSON Lines) instead of text lines.")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 autocast on GPUs that support it, else fp32.")
    p.add_argument("--max-seq-length", type=_positive_int, default=None,
                   help="Tokens per input (default: the run's data.max_seq_length for qa, else "
                        "the model's positions).")
    p.add_argument("--truncation", choices=["error", "truncate"], default=None,
                   help="An input over --max-seq-length: an error, or cut (and marked). "
                        "Default: truncate for summarize, error otherwise; qa splits long "
                        "passages into windows instead.")
    p.add_argument("--doc-stride", type=_positive_int, default=None,
                   help="qa: tokens between window starts (default: the run's, else 128).")
    p.add_argument("--max-query-length", type=_positive_int, default=None,
                   help="qa: questions are cut to this many tokens (default: the run's, else 64).")
    p.add_argument("--top-k", type=_positive_int, default=None,
                   help="fill-mask: candidates per mask (default 5).")
    p.add_argument("--pooling", choices=["mean", "cls"], default=None,
                   help="embed: mean of the token vectors (default) or the first token's.")
    p.add_argument("--num-beams", type=_positive_int, default=None,
                   help="summarize: beams (default: the model's generation_config.json).")
    p.add_argument("--max-length", type=_positive_int, default=None,
                   help="summarize: longest summary in tokens (the decoder start included).")
    p.add_argument("--min-length", type=int, default=None,
                   help="summarize: shortest summary in tokens.")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="summarize: beam score = log-prob / length ** length_penalty.")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None,
                   help="summarize: never repeat an n-gram of this size (0 = off).")

    p = add("serve", _serve, "Serve a model over HTTP (its task's endpoint, /v1/embeddings, "
            "/health, /metrics, /docs, a page at /) with dynamic batching.")
    p.add_argument("--model", required=True,
                   help="A model directory (PyTorch) or a `bertforge export onnx` directory.")
    p.add_argument("--host", default="127.0.0.1",
                   help="Address to listen on (0.0.0.0 accepts other machines: set an API key).")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one).")
    p.add_argument("--task", default=None,
                   help="question-answering, text-classification, token-classification, "
                        "fill-mask, summarization or feature-extraction (default: from the "
                        "model's config.json).")
    p.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                   help="torch, or onnxruntime on model.onnx / model.int8.onnx of an export.")
    p.add_argument("--api-key", default=None,
                   help="Require `Authorization: Bearer KEY` (or X-API-Key) on /v1/* and "
                        "/metrics (default: env BERTFORGE_API_KEY, else open).")
    p.add_argument("--max-batch-tokens", type=_positive_int, default=8192,
                   help="Token budget of one model call (padded lengths summed).")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="How long a request waits for others to join its batch.")
    p.add_argument("--max-batch-items", type=_positive_int, default=32,
                   help="Items per model call and per {\"inputs\": [...]} request (413 beyond).")
    p.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20,
                   help="Largest request body (413 beyond).")
    p.add_argument("--max-text-chars", type=_positive_int, default=100_000,
                   help="Longest string in an item field (413 beyond).")
    p.add_argument("--truncation", choices=["error", "truncate"], default=None,
                   help="Inputs over the model's length: 422 (error) or cut and flagged "
                        "(truncate); default: the task's (error; QA windows, summaries cut).")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N.")
    p.add_argument("--no-embeddings", action="store_true",
                   help="Do not serve /v1/embeddings (it loads the encoder a second time).")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"], help="Log level.")

    p = add("export", _export, "Export a fine-tuned BERT to ONNX (parity-checked), optionally "
            "int8-quantized and as a Triton model repository.")
    p.add_argument("what", choices=["onnx"], help="The format.")
    p.add_argument("--model", required=True, help="A model directory (BERT heads).")
    p.add_argument("--output", required=True, help="A new (or empty) output directory.")
    p.add_argument("--opset", type=_positive_int, default=17, help="ONNX opset.")
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="Also write model.int8.onnx (onnxruntime dynamic quantization) and "
                        "report the accuracy change.")
    p.add_argument("--sample", default=None,
                   help="Texts to check parity and the int8 change on, one per line (a pair or "
                        "question/context separated by a tab).")
    p.add_argument("--triton", action="store_true",
                   help="Also write a Triton Inference Server model repository (triton/).")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="Largest allowed |PyTorch - onnxruntime| difference of any output.")
    p.add_argument("--exporter", choices=["auto", "dynamo", "torchscript"], default="auto",
                   help="torch.onnx exporter: auto tries dynamo, then TorchScript.")

    p = add("plan", _plan, "Propose micro-batch size and accumulation for a GPU setup.")
    p.add_argument("--model", default="bert-large-uncased", help="Preset name or config.json.")
    p.add_argument("--seq-len", type=_positive_int, default=128, help="Sequence length.")
    p.add_argument("--gpus", type=_positive_int, default=8, help="Total GPUs (all nodes).")
    p.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU.")
    p.add_argument("--global-batch-size", type=_positive_int, default=65536, help="Target global batch.")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16",
                   help="Training precision.")

    p = add("demo", _demo, "Run the end-to-end demo on the bundled sample corpus.")
    p.add_argument("--workdir", default="build/demo", help="Where the demo writes its files.")
    p.add_argument("--steps", type=_positive_int, default=300, help="BERT pretraining steps.")
    p.add_argument("--bart-steps", type=_positive_int, default=300,
                   help="BART denoising pretraining steps.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("pretrain", "finetune", "predict"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s"
                        if args.verbose else "%(message)s")
    try:
        with raise_on_stop():  # SIGTERM at any moment outside the train loop: a clean exit
            return args.handler(args, extra)
    except (UserError, RunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # permissions, a full disk, a vanished file: not a bug of ours
        print(f"error: {os_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Stopped as exc:  # the command printed what it kept; say why it ended
        print(f"stopped by {exc.signal_name}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
