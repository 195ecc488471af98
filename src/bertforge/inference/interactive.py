"""``bertforge predict MODE``: a model's pipeline from the terminal, for inputs given as options
or read from stdin one per line.

``predict qa`` answers ``--question`` about ``--context`` (or ``--context-file``); without a
question it reads questions from stdin against the same context, answering each as it comes,
which is NVIDIA's interactive SQuAD script as a command. The other modes read ``--text``
(repeatable) or stdin lines. On a terminal a prompt is shown and a bad line is reported and
skipped; from a pipe lines are answered in batches and a bad line ends the command (exit 2).
Output is one human-readable line per input, or with ``--json`` one JSON object per input.

This module imports torch only when a command runs, so the CLI can list ``MODES`` instantly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

from bertforge.core.io import json_text
from bertforge.errors import DataError, UserError
from bertforge.tasks.registry import get_task, predict_modes

MODES = predict_modes()
"""``bertforge predict`` mode -> task (the task registry's ``predict_mode`` of each task)."""
PIPE_BATCH = 32  # stdin lines answered per batch when stdin is not a terminal
CUT_ON_THE_COMMAND_LINE = "use --truncation truncate"
QUESTION_MODE = next(m for m, task in MODES.items()
                     if get_task(task).serving.form == "question-context")
"""The mode that asks about one passage (question answering); every other takes texts."""


def _read_context(context: str | None, context_file: str | None) -> str:
    if (context is None) == (context_file is None):
        raise UserError("predict qa needs the passage: give exactly one of --context TEXT and "
                        "--context-file FILE")
    if context is not None:
        return context
    path = Path(context_file)  # type: ignore[arg-type]
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"--context-file {path} does not exist") from None
    except UnicodeDecodeError:
        raise DataError(f"--context-file {path} is not UTF-8 text") from None


def format_result(pipeline: Any, result: dict) -> str:
    """One human-readable line (one line per mask for fill-mask) of a pipeline result."""
    line = pipeline.format_line(result)
    return line + ("  (input truncated)" if result.get("truncated") else "")


def _lines(stream: TextIO, prompt: str | None, stderr: TextIO) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines of ``stream``; ``prompt`` before each read.
    Blank lines are skipped and, from a pipe, counted in a note at the end (the output then
    has fewer lines than the input)."""
    # Lines are decoded one by one from the bytes where there are bytes, whatever the stream's
    # own error handler, so that a byte that is not UTF-8 is reported at its own line (by the
    # pipeline's check of every text) rather than wherever the stream's decoder stops.
    raw = getattr(stream, "buffer", None)
    number, blank = 0, []
    while True:
        if prompt:
            stderr.write(prompt)
            stderr.flush()
        line = (stream.readline() if raw is None
                else raw.readline().decode("utf-8", errors="surrogateescape"))
        if not line:
            break
        number += 1
        if line.strip():
            yield number, line.rstrip("\r\n")
        else:
            blank.append(number)
    if blank and not prompt:
        stderr.write(f"note: skipped {len(blank)} blank stdin line{'s' * (len(blank) > 1)} "
                     f"(line {', '.join(map(str, blank[:5]))}{', ...' * (len(blank) > 5)}); "
                     "the output has one line per non-blank input line\n")


def run_predict(mode: str, model: str | Path, *, question: str | None = None,
                context: str | None = None, context_file: str | None = None,
                texts: Sequence[str] = (), as_json: bool = False, device: str = "auto",
                precision: str = "auto", max_length: int | None = None,
                truncation: str | None = None, options: dict[str, Any] | None = None,
                fields: dict[str, Any] | None = None, stdin: TextIO, stdout: TextIO,
                stderr: TextIO) -> int:
    """Answer the inputs of ``bertforge predict MODE``; returns the exit status (0).

    ``options`` go to ``load_pipeline`` (e.g. doc_stride, pooling); ``fields`` are added to
    every request item (top_k, generation settings). User mistakes raise ``UserError``.
    """
    from bertforge.inference.pipelines import InputError, load_pipeline

    asks = mode == QUESTION_MODE
    if not asks and (question is not None or context is not None or context_file):
        raise UserError(f"--question, --context and --context-file belong to predict "
                        f"{QUESTION_MODE}, not {mode}")
    if asks and texts:
        raise UserError(f"predict {mode} takes --question (and reads more from stdin), not --text")
    passage = _read_context(context, context_file) if asks else None
    pipeline = load_pipeline(model, MODES[mode], device=device, precision=precision,
                             max_length=max_length, truncation=truncation, **(options or {}))
    extra = dict(fields or {})
    key = "question" if asks else "text"

    def item(text: str) -> dict[str, Any]:
        return {"question": text, "context": passage} if asks else {"text": text, **extra}

    def emit(text: str, result: dict) -> None:
        if as_json:
            stdout.write(json_text({key: text, **result}, "stdout", ensure_ascii=False) + "\n")
        else:
            stdout.write(format_result(pipeline, result) + "\n")
        stdout.flush()

    def answer(batch: list[tuple[str, str]]) -> None:
        requests = []
        for where, text in batch:
            try:
                requests.append(pipeline.parse(item(text)))
            except InputError as exc:  # in the command line's words: --truncation, not truncate=
                raise DataError(f"{where}: {exc.renamed({}, CUT_ON_THE_COMMAND_LINE)}") from None
        for (_, text), result in zip(batch, pipeline.run(requests)):
            emit(text, result)

    given = [question] if question is not None else list(texts)
    if given:
        for start in range(0, len(given), PIPE_BATCH):
            answer([(f"input {start + i + 1}", t)
                    for i, t in enumerate(given[start:start + PIPE_BATCH])])
        return 0
    interactive = stdin.isatty()
    prompt = f"{key}> " if interactive else None
    pending: list[tuple[str, str]] = []
    for number, text in _lines(stdin, prompt, stderr):
        if interactive:
            try:
                answer([(f"line {number}", text)])
            except DataError as exc:  # a typo on a terminal should not end the session
                stderr.write(f"error: {exc}\n")
            continue
        pending.append((f"stdin line {number}", text))
        if len(pending) == PIPE_BATCH:
            answer(pending)
            pending = []
    if pending:
        answer(pending)
    return 0


__all__ = ["MODES", "format_result", "run_predict"]
