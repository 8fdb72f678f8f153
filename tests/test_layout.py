"""The layout is part of the design: no import cycles, a pure core, a short top level.

The import graph is read with ``ast`` from the source (every import: module level, inside
functions, and under ``TYPE_CHECKING``), so a cycle cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "oominfer"
PURE_CORE = (
    "base",
    "settings",
    "model",
    "hardware",
    "rules",
    "memory",
    "planning",
    "speed",
    "k8s",
    "report",
)
"""The steps that must run anywhere, fast: no engine, no child process, no HTTP client."""
FORBIDDEN_IN_CORE = ("torch", "vllm", "transformers", "httpx", "subprocess")
STEPS = (
    "base", "settings", "model", "hardware", "rules", "memory", "speed", "planning", "runtime",
    "engines", "verify", "serving", "k8s", "api",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, wherever the statement is, with its dotted name."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from oominfer.k8s import render` imports the module oominfer.k8s.render.
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    yield f"{node.module}.{alias.name}"


def graph() -> dict[str, set[str]]:
    """oominfer module -> the oominfer modules it imports."""
    return {
        name: {m for m in imports_of(path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_finds_a_type_only_cycle() -> None:
    # The check must be able to fail: a cycle through a TYPE_CHECKING import is a cycle.
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from oominfer.b import B\n"
    tree_imports = [n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert "oominfer.b" in tree_imports
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    assert find_cycle(graph()) is None


def package_of(module: str) -> str:
    """The package a module lives in (a package is its own): ``oominfer.planning.search`` ->
    ``oominfer.planning``, ``oominfer.engines.transformers`` -> itself."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def package_graph() -> dict[str, set[str]]:
    """oominfer package -> the other oominfer packages its modules import."""
    edges: dict[str, set[str]] = {package_of(m): set() for m in MODULES}
    for module, targets in graph().items():
        edges[package_of(module)] |= {package_of(t) for t in targets} - {package_of(module)}
    return edges


def test_no_import_cycles_between_packages() -> None:
    """A loop between folders (planning -> engines -> planning) is a loop even when no two
    modules import each other; the top-level package counts as one too."""
    assert find_cycle(package_graph()) is None


def test_the_top_level_holds_only_the_entry_points() -> None:
    """Everything below imports base/ or settings/, never the top package: so no module at
    the top but the entry points (``__init__`` re-exports the API, ``__main__`` runs the CLI)."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"]


def closure(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(edges[node])
    return seen


@pytest.mark.parametrize("step", PURE_CORE)
def test_the_pure_core_imports_no_engine_process_or_http(step: str) -> None:
    """Every module of the step, and every oominfer module it reaches, imports none of
    FORBIDDEN_IN_CORE (a stdlib ``subprocess`` included)."""
    edges = graph()
    modules = [m for m in MODULES if m == f"oominfer.{step}" or m.startswith(f"oominfer.{step}.")]
    assert modules
    for module in modules:
        for reached in closure(module, edges):
            bad = [m for m in imports_of(MODULES[reached]) if m.split(".")[0] in FORBIDDEN_IN_CORE]
            assert not bad, f"{module} reaches {reached}, which imports {bad}"


def test_the_top_level_keeps_at_most_eight_files() -> None:
    files = sorted(p.name for p in PACKAGE.iterdir() if p.is_file())
    assert len(files) <= 8, files


@pytest.mark.parametrize("step", [*STEPS, "report", "cli"])
def test_each_step_is_a_folder(step: str) -> None:
    assert (PACKAGE / step / "__init__.py").is_file()


ONE_DECLARATION = (
    "max_num_seqs", "enforce_eager", "kv_cache_dtype", "gpu_memory_utilization",
    "max_num_batched_tokens",
)  # fmt: skip
"""Engine settings whose flag no product file spells but their declaration: messages, help
and argv take it from ``oominfer.settings`` (``flag("max_num_seqs")``, ``engine_args``)."""


@pytest.mark.parametrize("name", ONE_DECLARATION)
def test_an_engine_flag_is_spelt_only_where_it_is_declared(name: str) -> None:
    import re

    from oominfer.settings import flag

    spelt = re.compile(re.escape(flag(name)) + r"(?![\w-])")
    files = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if spelt.search(path.read_text(encoding="utf-8"))
    )
    assert files in ([], ["oominfer/settings/__init__.py"]), files
