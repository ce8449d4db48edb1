"""The dead-code check of ``make lint``: vulture, run with the Makefile's own flags and package list."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make to read the Makefile's variables")


def _make_variables(*names: str) -> list[str]:
    """The Makefile's variables, expanded by make itself (so the test cannot drift from ``make lint``)."""
    shown = " ".join(f"$({n})" for n in names)
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", f"print-vars: ; $(info {shown})", "print-vars"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(out.stdout)


def _vulture(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    flags = _make_variables("VULTURE_FLAGS")
    return subprocess.run(
        [sys.executable, "-m", "vulture", *flags, *map(str, paths)], cwd=ROOT, capture_output=True, text=True
    )


def test_the_flags_are_the_lint_targets() -> None:
    flags = _make_variables("VULTURE_FLAGS")
    assert "--min-confidence" in flags and "vulture_whitelist.py" in flags
    assert (ROOT / "vulture_whitelist.py").is_file()


def test_an_unused_function_fails_the_check(tmp_path: Path) -> None:
    package = tmp_path / "deadpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        "def used(x: int) -> int:\n"
        "    return x + 1\n"
        "\n"
        "\n"
        "def forgotten_helper(x: int) -> int:\n"
        "    return x * 2\n"
        "\n"
        "\n"
        "print(used(1))\n"
    )
    found = _vulture(package)
    assert found.returncode != 0, found.stdout + found.stderr
    assert "forgotten_helper" in found.stdout
    assert "'used'" not in found.stdout


def test_the_tree_has_no_dead_code() -> None:
    packages = _make_variables("PACKAGES")
    assert "libs/superfile/superfile" in packages and len(packages) > 1
    found = _vulture(*packages)
    assert found.returncode == 0, "dead code (delete it, or name a false positive in vulture_whitelist.py):\n" + (
        found.stdout + found.stderr
    )
