#!/usr/bin/env python3
"""Checks an executed notebook: no cell ended in an error or wrote to stderr, and every cell
tagged with what it shows has that output.

Tags (cell metadata "tags"): "shows-table" needs an HTML table in the cell's outputs,
"shows-svg" an SVG image (image/svg+xml, or an <svg> inside text/html). A cell that ran but
drew nothing would pass nbconvert; this is what catches it.

Usage: check-notebook.py EXECUTED.ipynb [...]
"""

import json
import sys


def rich(outputs, mime):
    return [o.get("data", {}).get(mime, "") for o in outputs if o.get("output_type") in ("display_data", "execute_result")]


def text(v):
    return "".join(v) if isinstance(v, list) else v


def check(path):
    nb = json.load(open(path))
    problems = []
    tagged = 0
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        if cell.get("execution_count") is None:
            problems.append(f"cell {i} was not executed")
        for o in outputs:
            if o.get("output_type") == "error":
                problems.append(f"cell {i} failed: {o.get('ename')}: {o.get('evalue')}")
        # evcxr reports only compile errors to Jupyter: a panic, or an error returned by `?`,
        # is printed on stderr and the cell "succeeds". The notebooks write nothing to stderr
        # otherwise, so any of it is a failure.
        stderr = "".join(text(o.get("text", "")) for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")
        if stderr.strip():
            problems.append(f"cell {i} wrote to stderr (a panic or an error under evcxr):\n{stderr.strip()[:2000]}")
        html = [text(h) for h in rich(outputs, "text/html")]
        svg = [text(s) for s in rich(outputs, "image/svg+xml")]
        tags = cell.get("metadata", {}).get("tags", [])
        if "shows-table" in tags:
            tagged += 1
            if not any("<table" in h for h in html):
                problems.append(f"cell {i} is tagged shows-table but has no HTML table")
        if "shows-svg" in tags:
            tagged += 1
            if not (any("<svg" in s for s in svg) or any("<svg" in h for h in html)):
                problems.append(f"cell {i} is tagged shows-svg but has no SVG")
    if tagged == 0:
        problems.append("no cell is tagged shows-table or shows-svg: nothing to check")
    for p in problems:
        print(f"{path}: {p}", file=sys.stderr)
    return not problems


if __name__ == "__main__":
    ok = all([check(p) for p in sys.argv[1:]])
    sys.exit(0 if ok else 1)
