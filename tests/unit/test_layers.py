"""The layers, enforced: an import graph read with ``ast`` from ``trtspec/`` (docs/architecture.md).

* no cycle among module-level imports;
* no cycle between files at all, counting every import: module-level, function-level ("lazy")
  and typing-only (``if TYPE_CHECKING:``). A lazy import only moves a circle to run time, and a
  typing-only one keeps the two files' designs tied; a circle is broken by moving what both use
  into a lower module;
* the torch-free modules reach no torch, transformers or ModelOpt through module-level imports;
* forbidden edges (any level, function-level imports included): the client and validation import
  nothing of the runtime, the runtime nothing of quantization, serving or the client, the stub side
  of Triton nothing of the launcher side and back, and nothing imports the CLI;
* a function-level import of a trtspec module says why it is lazy (``# lazy: reason``).
"""

from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "trtspec"

HEAVY = {"torch", "transformers", "modelopt", "accelerate", "safetensors"}

# prefixes of modules that must import (transitively, at module level) no HEAVY package
TORCH_FREE = (
    "trtspec.config", "trtspec.errors", "trtspec.manifest", "trtspec.acceptance", "trtspec.corpus",
    "trtspec.resources", "trtspec.versions", "trtspec.prompts", "trtspec.preflight", "trtspec.doctor",
    "trtspec.trtllm", "trtspec.triton.render", "trtspec.triton.placement", "trtspec.triton.launch",
    "trtspec.triton.procs", "trtspec.triton.backend.routing", "trtspec.triton.backend.router",
    "trtspec.triton.backend.requests", "trtspec.triton.backend.common", "trtspec.triton.backend.cancel",
    "trtspec.triton.backend.detok", "trtspec.triton.backend.coalesce", "trtspec.triton.backend.watchdog_model",
    "trtspec.triton.backend.bls", "trtspec.triton.backend.llmapi", "trtspec.triton.backend.tokenizer",
    "trtspec.triton.backend.engine", "trtspec.triton.backend.worker", "trtspec.triton.backend.guard",
    "trtspec.triton.access", "trtspec.sampling", "trtspec.speculative.spec",
    "trtspec.client", "trtspec.validate", "trtspec.deploy", "trtspec.speculative.stats", "trtspec.run_report",
    "trtspec.speculative.loaders", "trtspec.cli.app", "trtspec.cli.common", "trtspec.cli.inspect",
    "trtspec.cli.build", "trtspec.cli.serve", "trtspec.cli.measure", "trtspec.cli.deploy",
)

# importer prefix → imported prefixes it must never name, at any level
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "trtspec.client": ("trtspec.speculative", "trtspec.quantize", "trtspec.checkpoints", "trtspec.triton.backend",
                       "trtspec.pipeline", "trtspec.validate"),
    "trtspec.validate": ("trtspec.speculative", "trtspec.quantize", "trtspec.checkpoints", "trtspec.triton.backend",
                         "trtspec.pipeline"),
    "trtspec.speculative": ("trtspec.quantize", "trtspec.triton", "trtspec.client", "trtspec.validate",
                            "trtspec.checkpoints", "trtspec.pipeline", "trtspec.deploy"),
    "trtspec.triton.backend": ("trtspec.triton.launch", "trtspec.triton.render", "trtspec.pipeline",
                               "trtspec.quantize", "trtspec.validate", "trtspec.deploy"),
    "trtspec.triton.launch": ("trtspec.triton.backend", "trtspec.speculative", "trtspec.quantize"),
    "trtspec.triton.render": ("trtspec.triton.backend", "trtspec.triton.launch"),
    "trtspec.trtllm": ("trtspec.speculative", "trtspec.triton", "trtspec.client", "trtspec.validate"),
    "trtspec.config": ("trtspec.speculative", "trtspec.quantize", "trtspec.triton", "trtspec.client",
                       "trtspec.validate", "trtspec.trtllm", "trtspec.checkpoints", "trtspec.pipeline"),
    "trtspec.errors": ("trtspec.",),
    "trtspec.acceptance": ("trtspec.",),
    "trtspec.manifest": ("trtspec.config", "trtspec.speculative", "trtspec.triton", "trtspec.quantize"),
}
CLI = "trtspec.cli"


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def graph() -> dict[str, list[tuple[str, int, bool, str]]]:
    """module → [(imported module, line, at module level, source line)] (trtspec and third party)."""
    out: dict[str, list[tuple[str, int, bool, str]]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if "templates" in path.relative_to(PKG).parts:
            continue  # the thin model.py files run inside tritonserver and only import the backend
        name = module_name(path)
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        tree = ast.parse(src)
        top = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top.add(id(node))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for sub in ast.walk(node):
                    top.add(id(sub))  # typing only: not executed
            elif isinstance(node, ast.Try):
                for sub in node.body:
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        top.add(id(sub))
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, path.name == "__init__.py")
                # `from pkg import sub` imports pkg.sub when that is a module
                mods = [f"{base}.{a.name}" if (PKG.parent / f"{base}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                        or (PKG.parent / f"{base}.{a.name}".replace(".", "/") / "__init__.py").exists() else base
                        for a in node.names]
            else:
                continue
            level_top = id(node) in top
            typing_only = level_top and isinstance(node, ast.ImportFrom) and False
            for m in dict.fromkeys(mods):
                if not typing_only:
                    edges.append((m, node.lineno, level_top, lines[node.lineno - 1]))
        out[name] = edges
    return out


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def module_level_deps(mod: str) -> set[str]:
    """Every module that importing ``mod`` executes (its packages' __init__ included)."""
    g = graph()
    seen: set[str] = set()
    todo = [mod, *_parents(mod)]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for dep, _, top, _ in g.get(m, []):
            if top:
                todo += [dep, *[p for p in _parents(dep) if p.startswith("trtspec")]]
    return seen


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix.rstrip(".") or mod.startswith(prefix if prefix.endswith(".") else prefix + ".")


def test_no_module_level_cycle():
    g = graph()
    adj = {m: sorted({d for d, _, top, _ in es if top and d in g and d != m}) for m, es in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in adj:
        if v not in index:
            visit(v)
    assert not cycles, f"module-level import cycles: {cycles}"


def _sccs(adj: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in adj:
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(adj[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _a_cycle(comp: list[str], edges: dict[tuple[str, str], str]) -> str:
    """One circle through a component, as ``a:LINE imports b → b:LINE imports a``."""
    members = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    todo = [start]
    while todo:  # breadth first from start until an edge comes back to it
        v = todo.pop(0)
        for (a, b) in edges:
            if a != v or b not in members:
                continue
            if b == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                path.reverse()
                return " → ".join(f"{m} ({edges[(m, n)]})" for m, n in zip(path, path[1:] + [start]))
            if b not in prev and b != start:
                prev[b] = v
                todo.append(b)
    return ", ".join(comp)


def import_cycles(g: dict[str, list[tuple[str, int, bool, str]]]) -> list[str]:
    """Every circle of imports between trtspec's files, each named by one path through it."""
    edges: dict[tuple[str, str], str] = {}
    for mod, es in g.items():
        for dep, line, top, src in es:
            if dep in g and dep != mod:
                edges.setdefault((mod, dep), f"line {line}{'' if top else ', in a function'}: {src.strip()}")
    adj = {m: sorted({d for (a, d) in edges if a == m}) for m in g}
    return [_a_cycle(comp, edges) for comp in _sccs(adj)]


def test_no_import_cycle_between_files_counting_every_import():
    cycles = import_cycles(graph())
    assert not cycles, ("import circles between files (function-level and typing-only imports count: move "
                        "what both sides use into a lower module):\n" + "\n".join(cycles))


def test_the_cycle_finder_names_a_lazy_circle():
    g = {"p.a": [("p.b", 3, True, "from p.b import x")],
         "p.b": [("p.c", 9, False, "from p.c import y  # lazy: ...")],
         "p.c": [("p.a", 5, True, "from p.a import z"), ("os", 1, True, "import os")],
         "p.d": [("p.a", 2, True, "import p.a")]}
    assert import_cycles(g) == ["p.a (line 3: from p.b import x) → p.b (line 9, in a function: from p.c import y  "
                                "# lazy: ...) → p.c (line 5: from p.a import z)"]
    g["p.b"] = []
    assert import_cycles(g) == []


@pytest.mark.parametrize("prefix", TORCH_FREE)
def test_torch_free_modules_reach_no_torch(prefix):
    mods = [m for m in graph() if _under(m, prefix)]
    assert mods, f"{prefix}: no such module (update TORCH_FREE)"
    bad = {}
    for m in mods:
        heavy = {d.split(".")[0] for d in module_level_deps(m)} & HEAVY
        if heavy:
            bad[m] = sorted(heavy)
    assert not bad, f"torch-free modules import heavy packages at module level: {bad}"


# what the tensorrt_llm stub of the torch runtime runs (templates/tensorrt_llm/torch/1/model.py),
# and what it unpickles from its engine worker (the stats of each event)
WORKER_MODE_STUB = ("trtspec.triton.backend.engine", "trtspec.speculative.stats")


def test_a_worker_mode_engine_stub_loads_no_torch():
    """In serving.engine_process: worker the engine stub parses, answers and relays; torch and the
    weights live in the worker. A fresh interpreter, as the stub is, imports the stub's modules and
    builds a request's Sampling without loading torch (thread mode imports it lazily)."""
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in WORKER_MODE_STUB)
            + "import numpy as np\n"
            + "from trtspec.triton.backend.requests import parse_generation\n"
            + "t = {'input_ids': np.array([[1, 2]], np.int32), 'request_output_len': np.array([[4]], np.int32),\n"
            + "     'temperature': np.array([[0.7]], np.float32), 'runtime_top_k': np.array([[5]], np.int32)}\n"
            + "assert parse_generation(t.get).sampling.top_k == 5\n"
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in %r))\n" % sorted(HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the worker-mode engine stub loads: {out.strip()}"


def test_forbidden_edges():
    bad = []
    for mod, edges in graph().items():
        for dep, line, _, src in edges:
            if _under(dep, CLI) and not _under(mod, CLI):
                bad.append(f"{mod}:{line} imports the CLI: {src.strip()}")
            for importer, targets in FORBIDDEN.items():
                if _under(mod, importer) and any(_under(dep, t) if not t.endswith(".") else dep.startswith(t)
                                                 for t in targets):
                    bad.append(f"{mod}:{line} ({importer} must not import {dep}): {src.strip()}")
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_lazy_imports_say_why():
    bad = []
    for mod, edges in graph().items():
        path = PKG.parent / (mod.replace(".", "/") + ".py")
        if not path.exists():
            path = PKG.parent / mod.replace(".", "/") / "__init__.py"
        lines = path.read_text(encoding="utf-8").splitlines()
        for dep, line, top, src in edges:
            if top or not dep.startswith("trtspec"):
                continue
            context = lines[line - 1] + (lines[line - 2] if line >= 2 else "")
            if "# lazy:" not in context:
                bad.append(f"{mod}:{line}: {src.strip()}")
    assert not bad, ("function-level imports of trtspec modules without a `# lazy: reason` comment "
                     "(hoist them, or say which optional dependency or cycle makes them lazy):\n" + "\n".join(bad))
