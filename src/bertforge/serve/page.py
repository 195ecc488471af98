"""The page at ``GET /``: a form to try the served model from a browser.

Self-contained (inline CSS and script, no CDN or font downloads) so it works on an offline
machine and behind strict networks. It asks ``/health`` which endpoints the server has and each
one's form (the task registry's: a question and a context box for question answering, a text box
otherwise), shows it, and renders the
result: the answer highlighted in its context (``<mark id="answer">``), the entities marked in the
text, the label, the masks' candidates or the summary, with the raw JSON underneath.

Query parameters prefill the form (``?question=...&context=...`` or ``?text=...``, and
``endpoint=/v1/...``), and ``submit=1`` sends it at once, so a link (or a headless browser in the
tests) can show a prediction without any clicks. Model output is inserted as text nodes, never as
HTML. Kept as a Python string rather than a data file so every installation ships it.
"""

PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>bertforge serve</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 50rem; margin: 2rem auto; padding: 0 1rem;
         color: #222; }
  label { display: block; margin-top: 0.8rem; font-weight: 600; }
  input[type=text], input[type=password], textarea, select { width: 100%; box-sizing: border-box;
         font: inherit; padding: 0.4rem; }
  textarea { min-height: 8rem; }
  button { margin-top: 1rem; font: inherit; padding: 0.4rem 1.2rem; }
  mark { background: #ffe066; padding: 0 0.1rem; }
  #output { margin-top: 1.5rem; line-height: 1.6; white-space: pre-wrap; }
  #error { color: #b00020; margin-top: 1rem; }
  pre { background: #f4f4f4; padding: 0.6rem; overflow-x: auto; }
  .muted { color: #666; font-size: 0.9rem; }
</style>
</head>
<body>
<h1>bertforge serve</h1>
<p class="muted" id="model">Loading the model description...</p>
<form id="form">
  <label for="endpoint">Endpoint</label>
  <select id="endpoint"></select>
  <div id="qa-fields" hidden>
    <label for="question">Question</label>
    <input type="text" id="question" name="question">
    <label for="context">Context</label>
    <textarea id="context" name="context"></textarea>
  </div>
  <div id="text-fields" hidden>
    <label for="text">Text</label>
    <textarea id="text" name="text"></textarea>
  </div>
  <label for="key">API key (only if the server requires one)</label>
  <input type="password" id="key" autocomplete="off">
  <button type="submit" id="send">Run</button>
</form>
<div id="error" role="alert"></div>
<div id="output"></div>
<details><summary>Raw response</summary><pre id="raw"></pre></details>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let endpoints = {};

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

// The form of an endpoint's task comes from the server (/health, from the task registry).
function questionForm(path) {
  return (endpoints[path] || {}).form === "question-context";
}

function showFields() {
  const qa = questionForm($("endpoint").value);
  $("qa-fields").hidden = !qa;
  $("text-fields").hidden = qa;
}

// The text with [start, end) spans wrapped in <mark>; spans sorted and not overlapping.
function marked(text, spans) {
  const out = el("div");
  let at = 0;
  for (const s of spans) {
    out.append(text.slice(at, s.start));
    const m = el("mark", text.slice(s.start, s.end), s.attrs);
    out.append(m);
    at = s.end;
  }
  out.append(text.slice(at));
  return out;
}

function render(task, item, result) {
  const out = $("output");
  out.replaceChildren();
  if (task === "question-answering") {
    if (result.no_answer || result.answer === "") {
      out.append(el("p", "No answer in the context.", {id: "no-answer"}));
      out.append(el("div", item.context));
    } else {
      out.append(el("p", "Answer: " + result.answer + "  (score " +
                    Number(result.score).toFixed(3) + ")"));
      out.append(marked(item.context, [{start: result.start, end: result.end,
                                        attrs: {id: "answer"}}]));
    }
  } else if (task === "token-classification") {
    const spans = (result.entities || []).map((e) =>
      ({start: e.start, end: e.end, attrs: {title: e.tag, class: "entity"}}));
    out.append(marked(item.text, spans));
  } else if (task === "text-classification") {
    out.append(el("p", result.label !== undefined ?
      "Label: " + result.label + "  (score " + Number(result.score).toFixed(3) + ")" :
      "Score: " + result.score, {id: "label"}));
  } else if (task === "fill-mask") {
    (result.masks || []).forEach((cands, i) => {
      out.append(el("p", "[MASK] " + (i + 1) + ": " +
                    cands.map((c) => c.token + " " + Number(c.score).toFixed(3)).join(", ")));
    });
  } else if (task === "summarization") {
    out.append(el("p", result.summary, {id: "summary"}));
  } else if (result.embedding) {
    out.append(el("p", result.embedding.length + " dimensions: " +
                  result.embedding.slice(0, 5).map((x) => x.toFixed(4)).join(", ") + ", ..."));
  }
}

async function send(event) {
  if (event) event.preventDefault();
  const path = $("endpoint").value;
  const task = (endpoints[path] || {}).task;
  const item = questionForm(path) ?
    {question: $("question").value, context: $("context").value} : {text: $("text").value};
  const headers = {"Content-Type": "application/json"};
  if ($("key").value) headers["Authorization"] = "Bearer " + $("key").value;
  $("error").textContent = "";
  $("send").disabled = true;
  try {
    const response = await fetch(path, {method: "POST", headers, body: JSON.stringify(item)});
    const body = await response.json();
    $("raw").textContent = JSON.stringify(body, null, 2);
    if (!response.ok) {
      const e = body.error || {};
      $("error").textContent = response.status + ": " + (e.message || "request failed");
      $("output").replaceChildren();
    } else {
      render(task, item, body);
    }
  } catch (err) {
    $("error").textContent = "The request failed: " + err;
  } finally {
    $("send").disabled = false;
    document.body.dataset.state = "done";
  }
}

async function start() {
  const health = await (await fetch("/health")).json();
  endpoints = health.endpoints;
  $("model").textContent = "Task: " + health.task + ". Endpoints: " +
    Object.keys(endpoints).join(", ");
  for (const path of Object.keys(endpoints)) {
    $("endpoint").append(el("option", path, {value: path}));
  }
  if (params.get("endpoint") in endpoints) $("endpoint").value = params.get("endpoint");
  for (const name of ["question", "context", "text"]) {
    if (params.has(name)) $(name).value = params.get(name);
  }
  showFields();
  $("endpoint").addEventListener("change", showFields);
  $("form").addEventListener("submit", send);
  if (params.get("submit") === "1") await send();
}

start().catch((err) => { $("error").textContent = "Could not reach the server: " + err; });
</script>
</body>
</html>
"""

__all__ = ["PAGE_HTML"]
