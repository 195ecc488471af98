"""Deployment commands: ``serve`` (HTTP with dynamic batching) and ``export`` (ONNX)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bertforge.commands.base import Command, precision_option
from bertforge.core.limits import POOLINGS
from bertforge.errors import ConfigError
from bertforge.core.schema import REQUIRED, check_fields, opt, save_config
from bertforge.serve.settings import SETTING_NAMES, ServeSettings
from bertforge.tasks.registry import task_choices

_LIMITS = ServeSettings()  # the server's defaults, defined once there

EXPORT_CONFIG_NAME = "export-config.yaml"
DEFAULT_ATOL = 1e-4  # bertforge.export.onnx.DEFAULT_ATOL (that module imports torch)


@dataclass
class ServeConfig:
    """``bertforge serve``; the back end explains each option (``bertforge.serve.serve``)."""

    model: str = opt(REQUIRED, "A model directory (PyTorch) or a `bertforge export onnx` "
                     "directory.")
    host: str = opt("127.0.0.1", "Address to listen on (0.0.0.0 accepts other machines: set an "
                    "API key).")
    port: int = opt(8000, "TCP port (0: a free one).")
    task: Optional[str] = opt(None, "The task to serve, by name or alias (default: from the "
                              "model's config.json); --help lists them.")
    backend: str = opt("torch", "torch, or onnxruntime on model.onnx / model.int8.onnx of an "
                       "export.", choices=("torch", "onnx", "onnx-int8"))
    precision: str = precision_option("torch backend: ")
    api_key: Optional[str] = opt(None, "Require `Authorization: Bearer KEY` (or X-API-Key) on "
                                 "/v1/* and /metrics (default: env BERTFORGE_API_KEY, else "
                                 "open).")
    max_batch_tokens: int = opt(_LIMITS.max_batch_tokens, "Token budget of one model call "
                                "(padded lengths summed).", minimum=1)
    max_wait_ms: float = opt(_LIMITS.max_wait_ms, "How long a request waits for others to join "
                             "its batch.", minimum=0)
    max_batch_items: int = opt(_LIMITS.max_batch_items, "Items per model call and per "
                               "{\"inputs\": [...]} request (413 beyond).", minimum=1)
    max_queue: int = opt(_LIMITS.max_queue, "Request items held at once (being tokenized, "
                         "queued or computed); beyond it a request gets 503 with Retry-After "
                         "at once (0: automatic, --max-batch-tokens / 16, at least "
                         "--max-batch-items).", minimum=0)
    model_threads: int = opt(_LIMITS.model_threads, "CPU threads of one forward pass (0: "
                             "OMP_NUM_THREADS when set, else chosen per batch size between "
                             "every core but one, which leaves a core to HTTP and tokenization, "
                             "and every core, by which runs faster).", minimum=0)
    max_body_bytes: int = opt(_LIMITS.max_body_bytes, "Largest request body, with or without "
                              "Content-Length (413 beyond).", minimum=1)
    max_text_chars: int = opt(_LIMITS.max_text_chars, "Longest string in an item field (413 "
                              "beyond).", minimum=1)
    max_json_depth: int = opt(_LIMITS.max_json_depth, "Deepest nesting of arrays/objects in a "
                              "request body (413 beyond).", minimum=1)
    max_number_digits: int = opt(_LIMITS.max_number_digits, "Longest number, in characters, in "
                                 "a request body (413 beyond).", minimum=1)
    max_num_beams: int = opt(_LIMITS.max_num_beams, "Summarization: most beams per request, the "
                             "model's default included (413 beyond).", minimum=1)
    max_generation_length: int = opt(_LIMITS.max_generation_length, "Summarization: longest "
                                     "output (max_length) a request may ask for, in tokens (413 "
                                     "beyond).", minimum=1)
    max_generation_tokens: int = opt(_LIMITS.max_generation_tokens, "Summarization: num_beams x "
                                     "output length summed over a request's items (413 "
                                     "beyond).", minimum=1)
    header_timeout: float = opt(_LIMITS.header_timeout, "Seconds a client has to send a "
                                "request's headers (then 408 and the connection closes).")
    body_timeout: float = opt(_LIMITS.body_timeout, "Seconds a client has to send a request's "
                              "body once its headers came (408 beyond).")
    keep_alive_timeout: float = opt(_LIMITS.keep_alive_timeout, "Seconds an idle keep-alive "
                                    "connection stays open.")
    drain_timeout: float = opt(_LIMITS.drain_timeout, "On SIGTERM: seconds to keep answering "
                               "the requests already admitted (new ones get 503); then the "
                               "rest get 503 and the server exits.")
    replica_timeout: float = opt(_LIMITS.replica_timeout, "With --replicas: seconds a replica "
                                 "has to answer a batch before it is killed (503 for its "
                                 "requests) and restarted; 0: automatic, 10x the slowest "
                                 "seconds per token measured times the batch's tokens, at least "
                                 "60 (600 until measured).", minimum=0)
    replica_restarts: int = opt(_LIMITS.replica_restarts, "With --replicas: how many times each "
                                "replica that died or missed its deadline is restarted (back-off "
                                "1, 2, 4... s) before it is left down.", minimum=0)
    expose_paths: bool = opt(_LIMITS.expose_paths, "Show the model directory's path in /info and "
                             "/health (open without the API key); by default only its name.")
    truncation: Optional[str] = opt(None, "Inputs over the model's length: 422 (error), cut "
                                    "and flagged (truncate), or, for embeddings and "
                                    "classification, split into overlapping windows whose "
                                    "results are averaged (chunk; a request's \"truncate\": "
                                    "true still cuts); default: the task's (error; QA windows, "
                                    "summaries cut).", choices=("error", "truncate", "chunk"))
    device: str = opt("auto", "auto (CUDA if available), cpu, cuda, cuda:N, or a comma list "
                      "(cuda:0,cuda:1: one replica on each).")
    replicas: Optional[str] = opt(None, "Model copies in worker processes behind one port and "
                                  "queue: N (GPUs of --device in turn; on a CPU, cores/N threads "
                                  "each) or auto (one per GPU; 1 on a CPU). Default: one per "
                                  "--device listed, i.e. 1, in this process.")
    no_embeddings: bool = opt(False, "Do not serve /v1/embeddings (it loads the encoder a "
                              "second time).")
    log_level: str = opt("info", "Log level.",
                         choices=("critical", "error", "warning", "info", "debug"))

    def __post_init__(self) -> None:
        check_fields(self)


def run_serve(cfg: ServeConfig) -> int:
    from bertforge.serve import serve

    return serve(Path(cfg.model), host=cfg.host, port=cfg.port, task=cfg.task,
                 backend=cfg.backend, api_key=cfg.api_key, truncation=cfg.truncation,
                 device=cfg.device, embeddings=not cfg.no_embeddings, log_level=cfg.log_level,
                 replicas=cfg.replicas, precision=cfg.precision,
                 **{name: getattr(cfg, name) for name in SETTING_NAMES})


@dataclass
class ExportConfig:
    """``bertforge export``."""

    what: str = opt(REQUIRED, "The format: onnx, or sentence-transformers (the encoder with "
                    "its pooling, a directory SentenceTransformer(DIR) loads).", positional=True,
                    choices=("onnx", "sentence-transformers"))
    model: str = opt(REQUIRED, "A model directory (BERT heads).")
    output: str = opt(REQUIRED, "A new (or empty) output directory.")
    opset: int = opt(17, "ONNX opset.", minimum=1)
    quantize: Optional[str] = opt(None, "Also write model.int8.onnx (onnxruntime dynamic "
                                  "quantization) and report the accuracy change.",
                                  choices=("int8",))
    sample: Optional[str] = opt(None, "Texts to check parity and the int8 change on, one per "
                                "line (a pair or question/context separated by a tab).")
    triton: bool = opt(False, "Also write a Triton Inference Server model repository "
                       "(triton/).")
    atol: float = opt(DEFAULT_ATOL, "Largest allowed |PyTorch - onnxruntime| difference of any "
                      "output.")
    exporter: str = opt("auto", "torch.onnx exporter: auto tries dynamo, then TorchScript.",
                        choices=("auto", "dynamo", "torchscript"))
    pooling: Optional[str] = opt(None, "sentence-transformers: mean of the token vectors, the "
                                 "first token's or the last token's (default: the model's "
                                 "saved pooling, else mean).", choices=POOLINGS)
    normalize: bool = opt(False, "sentence-transformers: unit-length vectors (a Normalize "
                          "module; default: as the model was saved, else off).")

    def __post_init__(self) -> None:
        check_fields(self)
        onnx_only = {"--quantize": self.quantize, "--sample": self.sample,
                     "--triton": self.triton or None}
        given = [flag for flag, value in onnx_only.items() if value is not None]
        if self.what == "sentence-transformers" and given:
            raise ConfigError(f"{given[0]} applies to export onnx, not sentence-transformers")
        if self.what == "onnx" and (self.pooling is not None or self.normalize):
            raise ConfigError("--pooling and --normalize apply to export sentence-transformers, "
                              "not onnx")


def run_export(cfg: ExportConfig) -> int:
    if cfg.what == "sentence-transformers":
        return _export_sentence_transformers(cfg)
    from bertforge.export import export_onnx

    report = export_onnx(Path(cfg.model), Path(cfg.output), opset=cfg.opset,
                         quantize=cfg.quantize, sample=Path(cfg.sample) if cfg.sample else None,
                         triton=cfg.triton, atol=cfg.atol, exporter=cfg.exporter)
    save_config(cfg, Path(cfg.output) / EXPORT_CONFIG_NAME)
    print(report.summary())
    return 0


def _export_sentence_transformers(cfg: ExportConfig) -> int:
    from bertforge.export.sentence_transformers import export_sentence_transformers

    files = export_sentence_transformers(Path(cfg.model), Path(cfg.output), pooling=cfg.pooling,
                                         normalize=True if cfg.normalize else None)
    save_config(cfg, Path(cfg.output) / EXPORT_CONFIG_NAME)
    print(f"wrote {cfg.output}: {', '.join(files)}\n"
          f"load it with: SentenceTransformer({str(cfg.output)!r})")
    return 0


def serve_key_help() -> dict[str, str]:
    """``--task``'s help: the served tasks, from their records."""
    return {"task": f"{task_choices(served=True)}, or an alias (default: from the model's "
                    "config.json)."}


SERVE = Command("serve", "Serve a model over HTTP (its task's endpoint, /v1/embeddings, "
                "/health, /metrics, /docs, a page at /) with dynamic batching.", ServeConfig,
                run_serve, key_help=serve_key_help)
EXPORT = Command("export", "Export a fine-tuned BERT to ONNX (parity-checked), optionally "
                 "int8-quantized and as a Triton model repository, or as a sentence-transformers "
                 "embedding model.", ExportConfig, run_export,
                 saves=f"OUTPUT/{EXPORT_CONFIG_NAME}")
