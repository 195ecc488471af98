"""Shared, session-scoped inputs of the pretraining and fault-injection tests: a vocab, prepared data
and tiny models (and a tiny BART summarizer for the inference tests).

The data is built once per test session (well under a second) from tests/assets/tiny_corpus.txt:
a WordPiece vocab of the corpus (~460 tokens), native shards with sequences of at most 32 tokens,
the NSP objective and a validation split. The models are 2-layer, 32-wide BERTs given as
config.json files; ``vocab_size`` follows the data, as in a real run.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest
import torch

from bertforge.config import PretrainConfig, load_config
from bertforge.recipes import resolve_recipe
from bertforge.train.loop import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
DEBUG_RECIPE = resolve_recipe("debug/tiny-cpu")

# Keys of a metrics line that measure wall-clock speed, so differ between identical runs.
TIMING_KEYS = ("seq_per_s", "tokens_per_s")

# ``precision="auto"`` chooses by the CPU's units (bertforge.runtime.cpu): bf16 on a CPU with
# AVX512-BF16 or AMX, fp32 on one without. The suite runs as on a CPU without them, so that
# every test's numbers are the same on any machine; the tests of the choice set their own.
os.environ["BERTFORGE_CPU_UNITS"] = "none"

_TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 64, "max_position_embeddings": 64}


@pytest.fixture(scope="session", autouse=True)
def hub_offline_session(tmp_path_factory: pytest.TempPathFactory):
    """No test reaches the Hugging Face Hub: offline mode (this process, huggingface_hub's own
    constant and child processes) and an empty cache of the session's own, so a model name
    resolves only from a cache a test builds, and anything else fails at once."""
    import huggingface_hub.constants

    patch = pytest.MonkeyPatch()
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-hub-cache")))
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread: on a busy shared CPU, multi-threaded kernels spin
    and a step can take 100x longer. Runs that are compared also share the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_CUDA = (torch.cuda.is_available, torch.cuda.device_count, os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.fixture(scope="session", autouse=True)
def cpu_only_session():
    """Tests are deterministic wherever they run: on a machine with a GPU, everything not marked
    ``gpu`` runs on the CPU (bitwise resume and 1e-5 parity assume fp32 CPU arithmetic). For
    the whole session torch in this process sees no CUDA device, and child processes (torchrun,
    the CLI) get CUDA_VISIBLE_DEVICES="" so they see none either; ``gpu``-marked tests get the
    GPU back (``gpu_for_gpu_tests``). CUDA counted its devices at collection (the GPU tests'
    skipif), before the variable changes, so this process can still use them."""
    _CUDA[0]()
    patch = pytest.MonkeyPatch()
    patch.setattr(torch.cuda, "is_available", lambda: False)
    patch.setattr(torch.cuda, "device_count", lambda: 0)
    patch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def gpu_for_gpu_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setattr(torch.cuda, "is_available", _CUDA[0])
        monkeypatch.setattr(torch.cuda, "device_count", _CUDA[1])
        if _CUDA[2] is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", _CUDA[2])
    yield


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    """Environment for `bertforge` child processes: one thread, as the in-process runs, and no
    GPU (``cpu_only_session``)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class TinyData:
    root: Path
    data: Path          # `bertforge prepare` output: train + validation splits, seq <= 32, NSP
    vocab: Path         # vocab.txt the data was tokenized with
    model: Path         # config.json with BERT's default dropout (0.1): exercises RNG restore
    model_nodrop: Path  # the same shape without dropout: different micro-batch layouts agree


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyData:
    from bertforge.data.prepare import prepare
    from bertforge.tokenization.training import train_wordpiece

    root = tmp_path_factory.mktemp("tiny")
    vocab = root / "vocab.txt"
    train_wordpiece([CORPUS], vocab_size=1000, output=vocab, progress=False)
    data = root / "data"
    data.mkdir()
    # 0.2 holds out a few of the corpus's 7 documents, so the data has a validation split.
    prepare([CORPUS], vocab=vocab, output=data, max_seq_length=32, workers=1,
            validation_fraction=0.2, progress=False)
    model = root / "model.json"
    model.write_text(json.dumps(_TINY_MODEL))
    nodrop = root / "model_nodrop.json"
    nodrop.write_text(json.dumps({**_TINY_MODEL, "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0}))
    return TinyData(root=root, data=data, vocab=vocab, model=model, model_nodrop=nodrop)


@pytest.fixture(scope="session")
def tiny_bart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BART summarizer (d_model 32, 64 positions, no dropout) with a BPE tokenizer of the
    test corpus and generation settings."""
    from bertforge.models.bart import BartConfig, BartForConditionalGeneration
    from bertforge.models.generation import GenerationConfig
    from bertforge.tokenization.bpe import BpeTokenizer
    from bertforge.tokenization.training import train_bpe

    root = tmp_path_factory.mktemp("bart")
    train_bpe([CORPUS], vocab_size=300, output=root / "bpe", min_frequency=1, progress=False)
    tok = BpeTokenizer.from_pretrained(root / "bpe")
    config = BartConfig(vocab_size=tok.vocab_size, d_model=32, encoder_layers=1,
                        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                        dropout=0.0, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
                        eos_token_id=tok.eos_id, decoder_start_token_id=tok.eos_id,
                        forced_bos_token_id=tok.bos_id, forced_eos_token_id=tok.eos_id,
                        finetuning_task="summarization")
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config)
    model.generation_config = GenerationConfig.from_model_config(config, max_length=12,
                                                                 min_length=6)
    return model.save_pretrained(root / "model", tokenizer=tok)


def _overrides(tiny: TinyData, output_dir: Path, extra: tuple[str, ...]) -> list[str]:
    """Overrides of the debug recipe for a few-step run on the tiny data (``extra`` wins)."""
    return [f"--model={tiny.model}", f"--data.path={tiny.data}", f"--output_dir={output_dir}",
            "--train.max_steps=6", "--train.global_batch_size=8", "--train.micro_batch_size=4",
            "--train.log_every=1", "--train.eval_every=0", "--train.eval_batches=2",
            "--checkpoint.every=1000", "--checkpoint.keep=0", "--tensorboard=false", *extra]


@pytest.fixture(scope="session")
def tiny_args(tiny: TinyData) -> Callable[..., list[str]]:
    """``tiny_args(output_dir, "--key=value", ...)``: `bertforge pretrain` arguments that run the
    debug recipe for a few steps on the tiny data (later overrides win)."""
    return lambda output_dir, *extra: ["--config", str(DEBUG_RECIPE),
                                       *_overrides(tiny, output_dir, extra)]


@pytest.fixture(scope="session")
def tiny_config(tiny: TinyData) -> Callable[..., PretrainConfig]:
    """``tiny_config(output_dir, "--key=value", ...)``: the same run as a PretrainConfig."""
    return lambda output_dir, *extra: load_config(PretrainConfig, DEBUG_RECIPE,
                                                  _overrides(tiny, output_dir, extra))


@pytest.fixture(scope="session")
def run_metrics() -> Callable[..., list[dict]]:
    """``run_metrics(output_dir)``: the lines of its metrics.jsonl without the wall-clock keys
    (``seq_per_s``, ``tokens_per_s``), i.e. everything that must be reproducible."""

    def read(output_dir: Path) -> list[dict]:
        records = read_metrics(Path(output_dir) / "metrics.jsonl")
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]

    return read


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """Imports a script of benchmarks/ by its module name (the folder is on ``sys.path`` only
    while it loads, as when the script runs from there)."""
    folder = str(ROOT / "benchmarks")

    def load(name: str) -> ModuleType:
        sys.path.insert(0, folder)
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(folder)
    return load


@pytest.fixture(scope="session")
def stop_after() -> Callable[[int], type]:
    """``monkeypatch.setattr(bertforge.train.loop, "PreemptionFlag", stop_after(k))``: a stand-in
    for the loop's preemption flag that reports a request at the loop's ``k``-th poll, as if
    SIGTERM had arrived during the ``k``-th step of the run."""

    def make(step: int) -> type:
        class StopAfter:
            def __init__(self, announce: bool = True) -> None:  # noqa: ARG002 (the flag's)
                self.polls = 0

            @property
            def requested(self) -> bool:
                self.polls += 1
                return self.polls >= step

            def restore(self) -> None:
                pass

        return StopAfter

    return make


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``long`` tests (minutes each on a 2-core CPU: real-weights fine-tuning, the GPU check's
    benchmark stages) run only when asked for, so `make test` stays well inside CI's time
    budget."""
    if os.environ.get("BERTFORGE_LONG_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="long run; set BERTFORGE_LONG_TESTS=1 to run it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
