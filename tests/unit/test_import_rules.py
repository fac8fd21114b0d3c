"""The package layers of .importlinter hold, and the check catches a new circle."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dashboards.core import enqueue

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("tco_web", "worker", "assistant", "demo", "dashboards", "schedulers", "execution")
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*LINT, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / ".importlinter", root)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "templates", "static"))
    return root


def test_the_import_contracts_are_kept():
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_new_circle_between_packages_is_caught(tmp_path):
    root = _copy_tree(tmp_path)
    (root / "schedulers" / "circle_probe.py").write_text("from dashboards import models  # noqa\n")
    result = _lint(root)
    assert result.returncode != 0
    assert "Packages form layers" in result.stdout and "BROKEN" in result.stdout


def test_django_on_the_execution_side_is_caught(tmp_path):
    root = _copy_tree(tmp_path)
    (root / "execution" / "django_probe.py").write_text("import django  # noqa\n")
    result = _lint(root)
    assert result.returncode != 0
    assert "imports no Django" in result.stdout


def test_every_task_name_the_web_side_enqueues_is_registered():
    from tco_web.celery import app
    import worker.tasks  # noqa: F401 - registers the tasks

    assert set(enqueue.TASK_NAMES) <= set(app.tasks)


def _module_circles(packages) -> list[list[str]]:
    """The import circles between modules (strongly connected groups of two or more, every import
    grimp sees: module-level, function-level and TYPE_CHECKING)."""
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in graph.modules:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_module_imports_itself_around_a_circle():
    """No import circle anywhere in the product, between packages or between two modules of one."""
    sys.path.insert(0, str(REPO))
    assert _module_circles(PACKAGES) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    root = tmp_path / "pkgcircle"
    (root / "circ").mkdir(parents=True)
    (root / "circ" / "__init__.py").write_text("")
    (root / "circ" / "a.py").write_text("def f():\n    from circ import b\n    return b\n")
    (root / "circ" / "b.py").write_text("from circ import a\n")
    sys.path.insert(0, str(root))
    try:
        assert _module_circles(["circ"]) == [["circ.a", "circ.b"]]
    finally:
        sys.path.remove(str(root))
