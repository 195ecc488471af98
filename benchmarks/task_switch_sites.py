"""Where code, outside the task registry, compares against or keys a dict by a task name or alias:
the places a new task would have to touch (issue 19's "one place for each fact" measurement).

    python benchmarks/task_switch_sites.py            # the working tree
    python benchmarks/task_switch_sites.py e61c56b    # a commit (git archive)

Counts ``==``/``in`` comparisons and dict keys whose string constant is a task name, an alias or
a predict mode (it cannot tell a task switch from a string that happens to be one, e.g. a data
objective or an entity's "tag" key: read the listed lines).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import tempfile

NAMES = {"squad", "squad_v2", "glue", "classification", "swag", "token-classification",
         "summarization", "question-answering", "text-classification", "fill-mask",
         "feature-extraction", "multiple-choice", "qa", "classify", "tag", "embed", "summarize",
         "denoise"}


def constants(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Compare):
        found = []
        for side in [node.left, *node.comparators]:
            found += [side] if isinstance(side, ast.Constant) else []
            if isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                found += [e for e in side.elts if isinstance(e, ast.Constant)]
        return found
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if isinstance(k, ast.Constant)]
    return []


def sites(root: pathlib.Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.parts[-2:] == ("tasks", "registry.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if any(isinstance(c.value, str) and c.value in NAMES for c in constants(node)):
                out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def main() -> None:
    root = pathlib.Path(__file__).resolve().parents[1]
    if len(sys.argv) > 1:
        tmp = pathlib.Path(tempfile.mkdtemp())
        subprocess.run(f"git -C {root} archive {sys.argv[1]} src/bertforge | tar -x -C {tmp}",
                       shell=True, check=True)
        root = tmp
    found = sites(root / "src" / "bertforge")
    print(f"{len(found)} sites in {len({s.split(':')[0] for s in found})} files")
    for s in found:
        print("  " + s)


if __name__ == "__main__":
    main()
