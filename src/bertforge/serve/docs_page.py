"""The page at ``GET /docs``: the server's API described from its own OpenAPI schema, offline.

FastAPI's default ``/docs`` loads Swagger UI's script and style sheet from a CDN, so on a machine
without internet access (or behind a strict proxy) it is a blank page. This one is rendered on
the server, once, from ``app.openapi()``: every route with its method, summary and description,
its request body's example and schema, and its answers; no script, no external file. The schema
itself stays at ``/openapi.json`` for tools (Swagger UI, Postman, code generators) that the user
runs wherever they have them.
"""

from __future__ import annotations

import html
import json
from typing import Any

_STYLE = """
  body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
         color: #222; }
  h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
  .method { display: inline-block; min-width: 3.5rem; font-weight: 700; }
  pre { background: #f4f4f4; padding: 0.6rem; overflow-x: auto; font-size: 0.85rem; }
  details { margin: 0.4rem 0; }
  .muted { color: #666; font-size: 0.9rem; }
"""


def _resolve(schema: Any, components: dict) -> Any:
    """``schema`` with ``$ref``s into ``components`` replaced by what they name (one level deep
    per reference, which is all a request body here needs)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            return _resolve(components.get(ref.rsplit("/", 1)[1], {}), components)
        return {k: _resolve(v, components) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_resolve(v, components) for v in schema]
    return schema


def _block(title: str, value: Any) -> str:
    text = html.escape(json.dumps(value, indent=2, ensure_ascii=False))
    return f"<details><summary>{html.escape(title)}</summary><pre>{text}</pre></details>"


def _operation(method: str, path: str, op: dict, components: dict) -> str:
    parts = [f'<h3 id="{html.escape(method + path)}"><span class="method">{method.upper()}'
             f"</span> <code>{html.escape(path)}</code></h3>"]
    if op.get("summary"):
        parts.append(f"<p><b>{html.escape(op['summary'])}</b></p>")
    if op.get("description"):
        parts.append(f"<p>{html.escape(op['description'])}</p>")
    content = (op.get("requestBody") or {}).get("content", {}).get("application/json", {})
    if "example" in content:
        parts.append("<p>Example request body:</p><pre>"
                     + html.escape(json.dumps(content["example"], indent=2, ensure_ascii=False))
                     + "</pre>")
    for name, example in (content.get("examples") or {}).items():
        parts.append(_block(f"example: {name}", example.get("value", example)))
    if "schema" in content:
        parts.append(_block("request schema", _resolve(content["schema"], components)))
    answers = {code: answer.get("description", "")
               for code, answer in (op.get("responses") or {}).items()}
    if answers:
        parts.append("<p class=muted>Answers: " + html.escape(
            "; ".join(f"{code} {text}".strip() for code, text in answers.items())) + "</p>")
    return "\n".join(parts)


def docs_html(openapi: dict) -> str:
    """The whole page for the schema ``openapi`` (``FastAPI.openapi()``)."""
    components = (openapi.get("components") or {}).get("schemas", {})
    info = openapi.get("info", {})
    sections = []
    for path, methods in sorted((openapi.get("paths") or {}).items()):
        for method, op in methods.items():
            sections.append(_operation(method, path, op, components))
    security = (openapi.get("components") or {}).get("securitySchemes")
    auth = ("<p>With an API key set, send <code>Authorization: Bearer KEY</code> (or "
            "<code>X-API-Key: KEY</code>) on <code>/v1/*</code> and <code>/metrics</code>.</p>"
            if security else "")
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(info.get('title', 'API'))}: API</title><style>{_STYLE}</style></head>
<body>
<h1>{html.escape(info.get('title', 'API'))} <span class="muted">API</span></h1>
<p>Every route of this server. The machine-readable schema is at
<a href="/openapi.json">/openapi.json</a> (load it in Swagger UI, Postman or a client
generator); the page at <a href="/">/</a> tries the model from a form.</p>
{auth}
<h2>Routes</h2>
{''.join(sections)}
</body>
</html>
"""


__all__ = ["docs_html"]
