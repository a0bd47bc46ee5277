"""Running helm on the chart and checking what it renders: Kubernetes schemas (strict) for
built-in kinds, required fields for the operator CRDs the schemas do not hold."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "radixcluster"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


@dataclass(slots=True)
class Helm:
    binary: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)

    def lint(self, chart: Path, values_files: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
        return self.run("lint", "--strict", str(chart), *_values_flags(values_files))

    def template(
        self, chart: Path, values_files: tuple[Path, ...] = (), sets: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """The rendered manifests; raises ``RuntimeError`` with helm's message when it fails."""
        flags = [*_values_flags(values_files), *(f for s in sets for f in ("--set", s))]
        done = self.run("template", "rc", str(chart), "--namespace", "serving", *flags)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _values_flags(values_files: tuple[Path, ...]) -> list[str]:
    return [f for path in values_files for f in ("--values", str(path))]


# Fields each CRD kind must have, as paths; "[]" means every item of a list.
CRD_REQUIRED = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("spec.selector.matchLabels", "spec.endpoints[].port"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): (
        "spec.groups[].name",
        "spec.groups[].rules[].alert",
        "spec.groups[].rules[].expr",
    ),
}


def manifest_errors(docs: list[dict[str, Any]]) -> list[str]:
    """Every problem found in ``docs``: schema violations of built-in kinds (strict, at every
    version of KUBERNETES_VERSIONS), missing fields of known CRDs, unknown kinds."""
    errors: list[str] = []
    for doc in docs:
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        required = CRD_REQUIRED.get((doc.get("apiVersion"), doc.get("kind")))
        if required is not None:
            errors += [f"{what}: {path} missing" for path in required if not _has_path(doc, path.split("."))]
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
                errors.append(f"{what} (Kubernetes {version}): {_message(exc)}")
    return errors


def _message(exc: Exception) -> str:
    # Both exception types carry a one-line ``message``; str() would dump the whole schema.
    where = "/".join(str(p) for p in getattr(exc, "absolute_path", ()))
    return f"{getattr(exc, 'message', exc)} at /{where}"


def _has_path(node: Any, parts: list[str]) -> bool:
    if not parts:
        return node not in (None, "", [], {})
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        items = node.get(head[:-2]) if isinstance(node, dict) else None
        return isinstance(items, list) and bool(items) and all(_has_path(item, rest) for item in items)
    return isinstance(node, dict) and head in node and _has_path(node[head], rest)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def component(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` labelled app.kubernetes.io/component ``name``."""
    found = [d for d in by_kind(docs, kind) if d["metadata"]["labels"].get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"expected one {kind} of component {name}, rendered {len(found)}"
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)
