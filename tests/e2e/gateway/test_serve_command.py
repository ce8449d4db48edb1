"""``superfile serve`` comes from the gateway package through the ``superfile.commands`` entry point: the library's
command line imports no service, offers ``serve`` when the gateway is installed, and says what to install when
it is not."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points

import pytest
import superfile.cli


def test_the_gateway_registers_serve() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="superfile.commands")}
    assert found.get("serve") == "superfile_gateway.cli:register"
    args = superfile.cli._parser().parse_args(["serve", "file:///tmp/x", "--port", "9", "--no-auth"])
    assert (args.uri, args.port, args.no_auth, args.host) == ("file:///tmp/x", 9, True, "127.0.0.1")


def test_offering_serve_imports_neither_fastapi_nor_uvicorn() -> None:
    """Every ``superfile`` command builds the parser, so registering ``serve`` must stay cheap."""
    code = (
        "import sys, superfile.cli; superfile.cli._parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'uvicorn', 'starlette'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("installed", "reason"),
    [([], "not installed"), ([EntryPoint("serve", "no_such_gateway.cli:register", "superfile.commands")], "no_such")],
)
def test_without_the_gateway_serve_says_what_to_install(
    installed: list[EntryPoint], reason: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(superfile.cli, "entry_points", lambda group: installed)
    with pytest.raises(SystemExit) as done:
        superfile.cli.main(["serve", "file:///tmp/x", "--port", "9", "--no-auth"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: superfile serve needs the gateway package (") and reason in err
    assert "pip install 'superfile[service]' ./services/gateway" in err
