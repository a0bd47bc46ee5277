"""The Helm chart: lints strictly, renders valid Kubernetes objects for the default, GPU
(tp 8) and multi-node values, wires its objects to one another, and passes the values on to
`radixcluster up` as flags the real CLI accepts."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixcluster.server_args import ServerArgs, add_cli_args, server_args_from_namespace
from support.chart_checks import CHART, Helm, by_kind, container, manifest_errors, one
from support.helm_binary import helm_binary

GPU_VALUES = CHART / "ci" / "gpu-tp8-values.yaml"
MULTINODE_VALUES = CHART / "ci" / "multinode-values.yaml"
VALUES = {"default": (), "gpu": (GPU_VALUES,), "multinode": (MULTINODE_VALUES,)}


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    cache = getattr(request.config, "cache", None)
    # Without pytest's cache (-p no:cacheprovider) the binary lives for this session only.
    directory = cache.mkdir("helm") if cache is not None else tmp_path_factory.mktemp("helm")
    return Helm(helm_binary(Path(directory)))


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request: pytest.FixtureRequest, helm: Helm) -> tuple[str, list[dict[str, Any]]]:
    return request.param, helm.template(CHART, VALUES[request.param])


def server_args(docs: list[dict[str, Any]]) -> ServerArgs:
    """The Deployment's args parsed by the real `radixcluster up` parser, $(VAR) filled in."""
    args = container(one(docs, "Deployment"), "server")["args"]
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return server_args_from_namespace(parser.parse_args([re.sub(r"\$\((\w+)\)", r"<\1>", a) for a in args]))


@pytest.mark.parametrize("name", list(VALUES))
def test_lint_strict(helm: Helm, name: str) -> None:
    done = helm.lint(CHART, VALUES[name])
    assert done.returncode == 0, done.stdout + done.stderr


def test_manifests_validate_strictly(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert manifest_errors(docs) == []


def test_objects_reference_each_other(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    deployment, service = one(docs, "Deployment"), by_kind(docs, "Service")
    pod = deployment["spec"]["template"]
    server_service = next(s for s in service if s["spec"].get("clusterIP") != "None")
    assert server_service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in container(deployment, "server")["ports"]}
    assert {p["targetPort"] for p in server_service["spec"]["ports"]} <= ports
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {m["name"] for m in container(deployment, "server")["volumeMounts"]} <= volumes
    secrets = {s["metadata"]["name"] for s in by_kind(docs, "Secret")}
    existing = {"radixcluster-api-key"} if name == "gpu" else set()
    refs = [
        e["valueFrom"]["secretKeyRef"]["name"]
        for workload in by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")
        for c in workload["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert refs and set(refs) <= secrets | existing


def test_default_is_cpu_with_the_embedded_model_and_a_generated_key(helm: Helm) -> None:
    docs = helm.template(CHART)
    server = container(one(docs, "Deployment"), "server")
    args = server_args(docs)
    assert (args.host, args.port, args.tp_size, args.model_path) == ("0.0.0.0", 30000, 1, None)
    # the key reaches the server through its environment, never its command line (ps shows that)
    assert not any("api-key" in arg for arg in server["args"])
    key = next(e for e in server["env"] if e["name"] == "RADIXCLUSTER_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": one(docs, "Secret")["metadata"]["name"], "key": "api-key"}
    assert "nvidia.com/gpu" not in server["resources"].get("limits", {})
    assert server["image"].endswith("-cpu")
    secret = one(docs, "Secret")
    assert len(secret["data"]["api-key"]) > 40
    shm = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert "/health_generate" in server["readinessProbe"]["exec"]["command"][-1]
    assert server["livenessProbe"]["httpGet"]["path"] == server["startupProbe"]["httpGet"]["path"] == "/health"
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "ServiceMonitor")


def test_gpu_values_reach_flags_limits_and_volumes(helm: Helm) -> None:
    docs = helm.template(CHART, (GPU_VALUES,))
    deployment = one(docs, "Deployment")
    server = container(deployment, "server")
    args = server_args(docs)
    assert args.tp_size == 8 and server["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert server["image"].endswith("-cuda")
    assert args.model_path == "/models/Meta-Llama-3-70B-Instruct"
    assert (args.max_total_tokens, args.mem_fraction_static, args.page_size) == (1000000, 0.88, 16)
    assert (args.dtype, args.schedule_policy, args.served_model_name) == ("bfloat16", "lpm", "llama-3-70b-instruct")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "llama-3-70b", "readOnly": True}
    assert not by_kind(docs, "Secret"), "an existingSecret is used, none created"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "radixcluster-api-key"
    rule_names = [r["alert"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert "RadixclusterKVCacheExhausted" in rule_names
    assert "radixcluster-dashboard.json" in one(docs, "ConfigMap")["data"]


def test_multinode_joins_the_ray_head(helm: Helm) -> None:
    docs = helm.template(CHART, (MULTINODE_VALUES,))
    deployment = one(docs, "Deployment")
    server = container(deployment, "server")
    head = one(docs, "StatefulSet")
    head_service = next(s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None")
    assert head_service["spec"]["selector"].items() <= head["spec"]["template"]["metadata"]["labels"].items()
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["RAY_ADDRESS"] == f"{head_service['metadata']['name']}:6379"
    assert server_args(docs).ray_address == "<RAY_ADDRESS>"
    script = server["command"][2]
    assert "--num-gpus=2" in script and 'exec radixcluster up "$@"' in script
    assert "--num-cpus=0" in container(head, "ray-head")["command"]
    assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= {e["name"] for e in container(head, "ray-head")["env"]}
    assert env["RAY_AUTH_MODE"] == "token"
    assert one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_no_key_means_no_auth_anywhere(helm: Helm) -> None:
    docs = helm.template(
        CHART, sets=("apiKey.create=false", "monitoring.serviceMonitor.enabled=true", "probes.readiness.path=/health")
    )
    assert server_args(docs).api_key is None and not by_kind(docs, "Secret")
    assert "RADIXCLUSTER_API_KEY" not in {e["name"] for e in container(one(docs, "Deployment"), "server")["env"]}
    assert "authorization" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert (
        '127.0.0.1:30000/health"'
        in container(one(docs, "Deployment"), "server")["readinessProbe"]["exec"]["command"][-1]
    )


def test_sigterm_drains_within_the_grace_period(helm: Helm) -> None:
    """The pod keeps serving through the preStop sleep, then the drain gets --shutdown-timeout,
    and Kubernetes waits for all of it (and the teardown) before SIGKILL."""
    docs = helm.template(CHART, sets=("server.shutdownTimeout=45", "terminationGracePeriodSeconds=70"))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    server = container(one(docs, "Deployment"), "server")
    assert server["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert server_args(docs).shutdown_timeout == 45
    assert pod["terminationGracePeriodSeconds"] == 70 >= 5 + 45 + 15
    with pytest.raises(RuntimeError, match="terminationGracePeriodSeconds"):
        helm.template(CHART, sets=("server.shutdownTimeout=45",))  # the default 60 s cannot hold it


def test_bad_values_are_refused(helm: Helm) -> None:
    for sets in (("server.tpSize=0",), ("model.source=s3",), ("model.source=pvc",), ("server.schedulePolicy=random",)):
        with pytest.raises(RuntimeError):
            helm.template(CHART, sets=sets)


BREAKS = {
    # A template that no longer parses: lint and render fail.
    "syntax": ("service.yaml", '{{ include "radixcluster.fullname" . }}', '{{ include "radixcluster.fullname" . '),
    # Renders and lints, but a field the Deployment schema does not have: only validation sees it.
    "schema": ("deployment.yaml", "containerPort:", "containerPorts:"),
}


@pytest.mark.parametrize("kind", list(BREAKS))
def test_checks_fail_on_a_broken_template(helm: Helm, tmp_path: Path, kind: str) -> None:
    chart = tmp_path / "radixcluster"
    shutil.copytree(CHART, chart)  # follows the files/ links, so the copy stands alone
    template, old, new = BREAKS[kind]
    path = chart / "templates" / template
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    if kind == "syntax":
        assert helm.lint(chart).returncode != 0
        with pytest.raises(RuntimeError):
            helm.template(chart)
    else:
        assert helm.lint(chart).returncode == 0
        errors = manifest_errors(helm.template(chart))
        assert errors and all(e.startswith("Deployment/") and "/ports/0" in e for e in errors)
