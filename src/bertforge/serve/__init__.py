"""``bertforge serve``: a fine-tuned model behind an HTTP API with dynamic batching.

:func:`serve` is the command (load, bind, run until SIGTERM, drain); the app itself is
:func:`bertforge.serve.app.create_app` (FastAPI), batching is :mod:`bertforge.serve.batching`
(pure asyncio) and the Prometheus series are :mod:`bertforge.serve.metrics`. Importing this
package does not import FastAPI or uvicorn, so the CLI can name the missing extra instead of
failing with an import traceback.
"""

from bertforge.serve.server import API_KEY_ENV, serve

__all__ = ["API_KEY_ENV", "serve"]
