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
