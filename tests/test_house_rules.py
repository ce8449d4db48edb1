"""The house rules `make lint` enforces, each shown to catch its violation.

The import rules are the contracts in the root pyproject.toml ([tool.importlinter], run by lint-imports). Each
test takes the real contract, renames the library `superfile` to a throwaway package `house` built in tmp_path
(one empty package per floor of the layers contract), adds exactly one violation, and runs lint-imports on it:
the run fails and names the violation; the same package without it passes. The real tree itself is checked by
`make lint`, not here. The private-member rule (ruff SLF001) is checked against the real ruff configuration.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMPORTLINTER = CONFIG["tool"]["importlinter"]
CONTRACTS = {contract["id"]: contract for contract in IMPORTLINTER["contracts"]}
BIN = Path(sys.executable).parent


def renamed(value: Any) -> Any:
    """A contract's settings with the library `superfile` (and its modules) renamed to `house`."""
    if isinstance(value, str):
        return re.sub(r"^superfile(?=\.|$)", "house", value)
    if isinstance(value, list):
        return [renamed(v) for v in value]
    return value


def build_house(tmp_path: Path, files: dict[str, str]) -> None:
    """The package `house`: one empty package per layer of the layers contract, then ``files``."""
    tails = [t.strip().strip("()") for layer in CONTRACTS["layers"]["layers"] for t in re.split(r"[|:]", layer)]
    for tail in tails:
        for depth in range(1, tail.count(".") + 2):
            package = tmp_path / "house" / Path(*tail.split(".")[:depth])
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
    (tmp_path / "house" / "__init__.py").touch()
    for name, text in files.items():
        (tmp_path / name).write_text(text)


def lint_imports(tmp_path: Path, contract_id: str) -> subprocess.CompletedProcess[str]:
    """lint-imports over `house` with the real session options and the real contract ``contract_id``."""
    session = {k: renamed(v) for k, v in IMPORTLINTER.items() if k != "contracts"}
    contract = {k: renamed(v) for k, v in CONTRACTS[contract_id].items()}
    lines = ["[tool.importlinter]"] + [f"{k} = {json.dumps(v)}" for k, v in session.items()]
    lines += ["[[tool.importlinter.contracts]]"] + [f"{k} = {json.dumps(v)}" for k, v in contract.items()]
    config = tmp_path / "contracts.toml"
    config.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", "--no-logo", str(config)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(BIN)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_broken(result: subprocess.CompletedProcess[str], *messages: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout, result.stdout + result.stderr
    for message in messages:
        assert message in result.stdout, result.stdout


# ------------------------------------------------------------------ the contracts are there


def test_contracts_are_configured() -> None:
    kinds = {contract_id: contract["type"] for contract_id, contract in CONTRACTS.items()}
    assert kinds == {
        "layers": "layers",
        "acyclic": "acyclic_siblings",
        "no-services": "forbidden",
        "sdk-without-engine": "forbidden",
    }
    assert IMPORTLINTER["root_packages"] == ["superfile"]
    assert IMPORTLINTER["exclude_type_checking_imports"] is False  # a type-only import is a dependency too


def test_layers_contract_orders_the_floors() -> None:
    layers = CONTRACTS["layers"]
    assert layers["containers"] == ["superfile"] and layers["exhaustive"] is True
    floors = [set(re.split(r"\s*[|:]\s*", layer.replace("(", "").replace(")", ""))) for layer in layers["layers"]]

    def floor(module: str) -> int:
        return next(i for i, names in enumerate(floors) if module in names)  # 0 is the top

    high_to_low = ["cli", "connection", "sql", "search.root", "table", "commit", "manifest", "io", "errors"]
    assert [floor(m) for m in high_to_low] == sorted(floor(m) for m in high_to_low)
    assert floor("search.request") > floor("remote") > floor("search.fleet")  # the SDK takes the request value
    assert floor("validate") > floor("io") and floor("errors") == len(floors) - 1


def test_forbidden_contracts_name_every_service_and_the_engine() -> None:
    services = {path.parent.name for path in ROOT.glob("services/*/superfile_*/__init__.py")}
    assert services and services <= set(CONTRACTS["no-services"]["forbidden_modules"])
    assert CONTRACTS["no-services"]["source_modules"] == ["superfile"]
    sdk = CONTRACTS["sdk-without-engine"]
    assert sdk["source_modules"] == ["superfile.remote"]
    assert {"superfile.table", "superfile.commit"} <= set(sdk["forbidden_modules"])


def test_make_lint_runs_the_tools() -> None:
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "lint-imports" in recipe.group(1) and "ruff check" in recipe.group(1)


# ------------------------------------------------------------------ each contract catches its violation


def test_a_clean_house_passes_every_contract(tmp_path: Path) -> None:
    build_house(tmp_path, {"house/table/history.py": "import house.commit\n", "house/cli/main.py": "import house\n"})
    for contract_id in CONTRACTS:
        result = lint_imports(tmp_path, contract_id)
        assert result.returncode == 0, result.stdout + result.stderr


TYPE_ONLY = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import house.connection\n"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        # a floor importing one above it
        ({"house/errors/__init__.py": "import house.table\n"}, "house.errors is not allowed to import house.table"),
        # the same under TYPE_CHECKING (as sql/context.py takes Connection)
        (
            {"house/sql/context.py": TYPE_ONLY},
            "house.sql is not allowed to import house.connection",
        ),
        # a loop between two top-level packages breaks a floor (as table/search.py and search/root.py)
        (
            {
                "house/table/search.py": "import house.search.root\n",
                "house/search/root/searcher.py": "import house.table\n",
            },
            "house.table is not allowed to import house.search.root",
        ),
    ],
    ids=["upward", "type-checking", "loop"],
)
def test_layers_catch_an_import_up_the_floors(tmp_path: Path, files: dict[str, str], message: str) -> None:
    build_house(tmp_path, files)
    assert_broken(lint_imports(tmp_path, "layers"), message)


def test_acyclic_catches_a_loop_inside_a_package(tmp_path: Path) -> None:
    build_house(
        tmp_path,
        {
            "house/sql/context.py": "import house.sql.functions\n",
            "house/sql/functions.py": "from house.sql import context\n",
        },
    )
    assert_broken(lint_imports(tmp_path, "acyclic"), "No cycles are allowed in house.sql.")


def test_no_services_catches_the_library_importing_a_service(tmp_path: Path) -> None:
    serve = "def serve():\n    from superfile_gateway.__main__ import serve\n    serve()\n"  # lazily, as cli.py
    build_house(tmp_path, {"house/cli/serve.py": serve})
    assert_broken(lint_imports(tmp_path, "no-services"), "house is not allowed to import superfile_gateway")


@pytest.mark.parametrize("engine", ["table", "commit"])
def test_sdk_without_engine_catches_remote_importing_the_engine(tmp_path: Path, engine: str) -> None:
    build_house(tmp_path, {"house/remote/db.py": f"import house.{engine}.history\n", f"house/{engine}/history.py": ""})
    assert_broken(lint_imports(tmp_path, "sdk-without-engine"), f"house.remote is not allowed to import house.{engine}")


# ------------------------------------------------------------------ private members (ruff SLF001)

REACH = "def size(cache):\n    return cache._budget\n"


def ruff_as(path: str, source: str) -> subprocess.CompletedProcess[str]:
    """ruff with the repository's configuration over ``source`` as if it were the file ``path``."""
    return subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise", "--stdin-filename", path, "-"],
        cwd=ROOT,
        input=source,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_slf001_catches_a_private_reach_in_the_library() -> None:
    result = ruff_as("libs/superfile/superfile/house_rules_probe.py", REACH)
    assert result.returncode != 0
    assert "SLF001 Private member accessed: `_budget`" in result.stdout


def test_slf001_allows_own_members_and_code_outside_the_library() -> None:
    own = "class Cache:\n    def size(self):\n        return self._budget\n"
    assert ruff_as("libs/superfile/superfile/house_rules_probe.py", own).returncode == 0
    for path in ("libs/superfile/tests/test_probe.py", "services/gateway/superfile_gateway/probe.py", "bench/probe.py"):
        result = ruff_as(path, REACH)
        assert result.returncode == 0, result.stdout
