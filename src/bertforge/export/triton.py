"""A Triton Inference Server model repository for an exported model (NVIDIA's BERT deployment).

Layout (Triton's model repository convention)::

    triton/
      README.md                how to start tritonserver and call the model
      NAME/
        config.pbtxt           the model configuration (protobuf text format, ModelConfig)
        1/model.onnx           version 1 of the model

The configuration uses the ONNX Runtime backend (``platform: "onnxruntime_onnx"``), declares
every input and output with its Triton data type and its shape without the batch axis (-1 for
the sequence axis), and turns on Triton's dynamic batcher, which groups concurrent requests of
one sequence length into a batch of up to ``max_batch_size``, waiting at most
``max_queue_delay_microseconds`` for company. Requests of different lengths are not batched
together (Triton batches only equal shapes), so clients that pad to a few fixed lengths (e.g.
128 and 384) batch best.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bertforge.export.heads import SEQUENCE, HeadSpec
from bertforge.core.io import write_text_atomic
from bertforge.models.config import BertConfig

_CURL_DATA = {"input_ids": "[2, 1037, 2158, 3]", "attention_mask": "[1, 1, 1, 1]",
              "token_type_ids": "[0, 0, 0, 0]"}
"""Placeholder values of the README's request (the ids depend on the vocabulary)."""
DEFAULT_QUEUE_DELAY_US = 500
"""Longest wait for more requests before a batch runs: 0.5 ms, small next to a BERT forward."""


def _tensor(name: str, data_type: str, dims: tuple[int, ...]) -> str:
    shape = ", ".join(str(d) for d in dims)
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: [ {shape} ]\n  }}'


def triton_config(name: str, spec: HeadSpec, config: BertConfig, *, max_batch_size: int = 64,
                  max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> str:
    """config.pbtxt text for the exported ``spec`` model of ``config``.

    Inputs are ``TYPE_INT64`` ``[-1]`` (sequence), outputs ``TYPE_FP32`` with the head's dims
    (``HeadSpec.output_dims``); the batch axis is implicit because ``max_batch_size`` > 0.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    preferred = [b for b in (4, 8, 16, 32) if b <= max_batch_size]
    inputs = ",\n".join(_tensor(n, "TYPE_INT64", (SEQUENCE,)) for n in spec.inputs)
    outputs = ",\n".join(_tensor(n, "TYPE_FP32", dims)
                         for n, dims in spec.output_dims(config).items())
    lines = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {max_batch_size}",
        f"input [\n{inputs}\n]",
        f"output [\n{outputs}\n]",
        "dynamic_batching {",
    ]
    if preferred:
        lines.append(f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]")
    lines += [f"  max_queue_delay_microseconds: {max_queue_delay_us}", "}"]
    return "\n".join(lines) + "\n"


def _readme(name: str, spec: HeadSpec) -> str:
    first, outputs = spec.outputs[0], ", ".join(f"`{o}`" for o in spec.outputs)
    inputs = ", ".join(f"`{n}`" for n in spec.inputs)
    width = max(len(n) for n in spec.inputs) + 3
    curl = ",\n".join(f'    {{"name": {json.dumps(n) + ",":<{width}} "shape": [1, 4], "datatype": '
                       f'"INT64", "data": {_CURL_DATA[n]}}}' for n in spec.inputs)
    return f"""# Triton model repository: {name}

Exported by `bertforge export onnx --triton` ({spec.architecture}). Inputs: {inputs}
(int64, [batch, sequence]); outputs: {outputs}.
Tokenize with the tokenizer files in the export directory (one level up), e.g.
`bertforge.tokenization.load_tokenizer(DIR)`, and pad every row of a request to one length.

## Start the server

Triton ships as NVIDIA's container (pick a release tag from NGC, e.g. 24.08):

```bash
docker run --rm --gpus all -p 8000:8000 -p 8001:8001 -p 8002:8002 \\
  -v "$PWD":/models nvcr.io/nvidia/tritonserver:24.08-py3 \\
  tritonserver --model-repository=/models
```

Run it from this directory (the one holding `{name}/`); without a GPU drop `--gpus all`.
Outside Docker: `tritonserver --model-repository=$PWD`. Check readiness with
`curl -s localhost:8000/v2/health/ready` and the model with
`curl -s localhost:8000/v2/models/{name}/config`.

## Call it over HTTP (KServe v2 protocol)

The ids below are placeholders: take them from the tokenizer ([CLS] and [SEP] ids depend on the
vocabulary).

```bash
curl -s localhost:8000/v2/models/{name}/infer -H 'Content-Type: application/json' -d '{{
  "inputs": [
{curl}
  ],
  "outputs": [{{"name": "{first}"}}]
}}'
```

## Call it from Python (`pip install tritonclient[http]`)

```python
import numpy as np
import tritonclient.http as httpclient
from bertforge.tokenization import load_tokenizer

tokenizer = load_tokenizer("..")  # the export directory
batch = tokenizer.pad_windows(tokenizer.encode_windows(["Hello world"], max_length=128), 128)
client = httpclient.InferenceServerClient("localhost:8000")
inputs = []
for name in {spec.inputs!r}:
    tensor = httpclient.InferInput(name, list(batch[name].shape), "INT64")
    tensor.set_data_from_numpy(batch[name].astype(np.int64))
    inputs.append(tensor)
result = client.infer("{name}", inputs)
print(result.as_numpy("{first}"))
```
"""


def write_triton_repository(root: Path, onnx_path: Path, spec: HeadSpec, config: BertConfig, *,
                            name: str, max_batch_size: int = 64,
                            max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> Path:
    """Write the repository at ``root`` (layout in the module docstring); returns ``root/name``.

    The model file is hard-linked to ``onnx_path`` where the file system allows it (no second
    copy of the weights on disk), copied otherwise.
    """
    model_dir = root / name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    target = version / "model.onnx"
    target.unlink(missing_ok=True)
    try:
        os.link(onnx_path, target)
    except OSError:
        shutil.copyfile(onnx_path, target)
    write_text_atomic(model_dir / "config.pbtxt",
                      triton_config(name, spec, config, max_batch_size=max_batch_size,
                                    max_queue_delay_us=max_queue_delay_us))
    write_text_atomic(root / "README.md", _readme(name, spec))
    return model_dir


__all__ = ["DEFAULT_QUEUE_DELAY_US", "triton_config", "write_triton_repository"]
