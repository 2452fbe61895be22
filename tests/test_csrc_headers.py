"""Link safety of the compiled kernels' headers (no GPU, no compiler: the sources read as text).

A non-template `__global__` function defined in a header has external linkage; two translation units that include
the header each define it and the package's `_C` fails to link (session 6: `dequant_chunk` in
deep_gemm's w4a16_dq_kernel.cuh cost a whole GPU run, although every file compiled on its own). Header kernels must be
templates, `static`, or in an unnamed namespace.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADERS = sorted(p for ext in ("*.cuh", "*.h", "*.hpp") for p in ROOT.glob(f"packages/*/csrc/**/{ext}"))
_GLOBAL = re.compile(r"^\s*(static\s+)?__global__\b")


def _strip_comments(text: str) -> str:
    """The source without // and /* */ comments (line breaks kept, so line numbers stay right)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _unnamed_namespace_depth(lines: list[str], upto: int) -> int:
    """How many `namespace {` blocks are open before line `upto` (a brace count per block; enough for these
    headers, which close each namespace with a matching brace)."""
    depth, stack = 0, []
    for line in lines[:upto]:
        for m in re.finditer(r"namespace\s*\{|\{|\}", line):
            tok = m.group(0)
            if tok == "}":
                if stack and stack.pop() == "anon":
                    depth -= 1
            elif tok.startswith("namespace"):
                stack.append("anon")
                depth += 1
            else:
                stack.append("brace")
    return depth


def external_header_kernels(path: pathlib.Path) -> list[str]:
    """`file:line name` of each __global__ DEFINITION in a header that is neither a template, nor static, nor in an
    unnamed namespace (declarations ending in ';' are fine)."""
    lines = _strip_comments(path.read_text()).split("\n")
    bad = []
    for i, line in enumerate(lines):
        m = _GLOBAL.match(line)
        if not m or m.group(1):
            continue
        body = " ".join(lines[i : i + 8])
        if body.find(";") != -1 and body.find(";") < (body.find("{") if "{" in body else len(body)):
            continue  # a declaration
        prev = next((p.strip() for p in reversed(lines[:i]) if p.strip()), "")
        if prev.startswith("template") or prev.endswith(">") and "template" in prev:
            continue
        if _unnamed_namespace_depth(lines, i) > 0:
            continue
        name = re.search(r"(\w+)\s*\(", line.split("__global__", 1)[1])
        bad.append(f"{path.relative_to(ROOT)}:{i + 1} {name.group(1) if name else line.strip()}")
    return bad


def test_headers_found() -> None:
    assert any(p.suffix == ".cuh" for p in HEADERS), "no CUDA headers under packages/*/csrc"


def test_no_external_kernels_in_headers() -> None:
    bad = [b for p in HEADERS for b in external_header_kernels(p)]
    assert not bad, "header __global__ kernels with external linkage (make them static or templates): " + ", ".join(bad)


def test_the_check_catches_a_plain_header_kernel(tmp_path: pathlib.Path) -> None:
    """The check itself: a plain kernel is flagged; static, templated, unnamed-namespace and declared ones are not."""
    src = tmp_path / "k.cuh"
    src.write_text(
        "// __global__ void in_comment() {}\n"
        "__global__ void plain(int* p) {\n  *p = 1;\n}\n"
        "static __global__ void local(int* p) { *p = 2; }\n"
        "template <int N>\n__global__ void templ(int* p) { *p = N; }\n"
        "namespace {\n__global__ void anon(int* p) { *p = 3; }\n}  // namespace\n"
        "__global__ void declared(int* p);\n"
    )
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert external_header_kernels(src) == ["k.cuh:2 plain"]
    finally:
        ROOT = old
