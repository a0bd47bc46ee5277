"""The Helm chart: lints strictly, renders valid Kubernetes objects for the default, GPU
(tp 8), multi-node, gateway and keys values, wires its objects to one another, and passes the
values on to `radixcluster up` and `radixcluster gateway` as flags the real CLI accepts."""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway_args import add_gateway_args, gateway_config_from_namespace
from radixcluster.server_args import ServerArgs, add_cli_args, server_args_from_namespace
from support.chart_checks import CHART, Helm, by_kind, component, container, manifest_errors, one
from support.helm_binary import helm_binary

GPU_VALUES = CHART / "ci" / "gpu-tp8-values.yaml"
MULTINODE_VALUES = CHART / "ci" / "multinode-values.yaml"
GATEWAY_VALUES = CHART / "ci" / "gateway-values.yaml"
KEYS_VALUES = CHART / "ci" / "keys-values.yaml"
VALUES = {
    "default": (),
    "gpu": (GPU_VALUES,),
    "multinode": (MULTINODE_VALUES,),
    "gateway": (GATEWAY_VALUES,),
    "keys": (KEYS_VALUES,),
}
# Secrets the values files name but the chart does not create.
EXISTING_SECRETS = {"gpu": {"radixcluster-api-key"}, "keys": {"rc-admin", "rc-tenants"}}


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    cache = getattr(request.config, "cache", None)
    # Without pytest's cache (-p no:cacheprovider) the binary lives for this session only.
    directory = cache.mkdir("helm") if cache is not None else tmp_path_factory.mktemp("helm")
    return Helm(helm_binary(Path(directory)))


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request: pytest.FixtureRequest, helm: Helm) -> tuple[str, list[dict[str, Any]]]:
    return request.param, helm.template(CHART, VALUES[request.param])


def _filled(args: list[str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", r"<\1>", a) for a in args]


def server_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return component(docs, "Deployment", "server")


def server_args(docs: list[dict[str, Any]]) -> ServerArgs:
    """The server Deployment's args parsed by the real `radixcluster up` parser, $(VAR) filled in."""
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return server_args_from_namespace(parser.parse_args(_filled(container(server_deployment(docs), "server")["args"])))


def gateway_config(docs: list[dict[str, Any]]) -> GatewayConfig:
    """The gateway Deployment's args parsed by the real `radixcluster gateway` parser, in an
    environment holding "<NAME>" for each variable the pod takes from a Secret."""
    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    gateway = container(component(docs, "Deployment", "gateway"), "gateway")
    assert gateway["command"] == ["radixcluster", "gateway"]
    secrets = {e["name"]: f"<{e['name']}>" for e in gateway.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    assert not any("key=" in arg and "key-file" not in arg for arg in gateway["args"]), "a key in the args shows in ps"
    with mock.patch.dict(os.environ, secrets):
        return gateway_config_from_namespace(parser.parse_args(_filled(gateway["args"])))


@pytest.mark.parametrize("name", list(VALUES))
def test_lint_strict(helm: Helm, name: str) -> None:
    done = helm.lint(CHART, VALUES[name])
    assert done.returncode == 0, done.stdout + done.stderr


def test_manifests_validate_strictly(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert manifest_errors(docs) == []


def test_objects_reference_each_other(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    deployment, service = server_deployment(docs), by_kind(docs, "Service")
    pod = deployment["spec"]["template"]
    front = next(s for s in service if s["spec"].get("clusterIP") != "None")
    # the Service reaches the replicas, or the gateway in front of them
    fronted = component(docs, "Deployment", "gateway") if name in ("gateway", "keys") else deployment
    assert front["spec"]["selector"].items() <= fronted["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in container(deployment, "server")["ports"]}
    assert {p["targetPort"] for p in front["spec"]["ports"]} <= ports
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {m["name"] for m in container(deployment, "server")["volumeMounts"]} <= volumes
    secrets = {s["metadata"]["name"] for s in by_kind(docs, "Secret")}
    existing = EXISTING_SECRETS.get(name, set())
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
    server = container(server_deployment(docs), "server")
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
    shm = next(v for v in server_deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert "/health_generate" in server["readinessProbe"]["exec"]["command"][-1]
    assert server["startupProbe"]["httpGet"]["path"] == "/health"
    assert server["livenessProbe"]["tcpSocket"]["port"] == "http"  # not /health: 503 while the TP group is replaced
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "ServiceMonitor")


def test_gpu_values_reach_flags_limits_and_volumes(helm: Helm) -> None:
    docs = helm.template(CHART, (GPU_VALUES,))
    deployment = server_deployment(docs)
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
    deployment = server_deployment(docs)
    server = container(deployment, "server")
    head = one(docs, "StatefulSet")
    head_service = next(s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None")
    assert head_service["spec"]["selector"].items() <= head["spec"]["template"]["metadata"]["labels"].items()
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["RAY_ADDRESS"] == f"{head_service['metadata']['name']}:6379"
    assert server_args(docs).ray_address == "<RAY_ADDRESS>"
    script = server["command"][2]
    assert "--num-gpus=3" in script and 'exec radixcluster up "$@"' in script
    assert "--num-cpus=0" in container(head, "ray-head")["command"]
    assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= {e["name"] for e in container(head, "ray-head")["env"]}
    assert env["RAY_AUTH_MODE"] == "token"
    assert one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_gateway_fronts_the_replicas_and_finds_them_through_a_headless_service(helm: Helm) -> None:
    docs = helm.template(CHART, (GATEWAY_VALUES,))
    replicas = next(s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None")
    front = next(s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") != "None")
    pods = server_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    gateway = component(docs, "Deployment", "gateway")
    assert replicas["spec"]["selector"].items() <= pods.items()
    assert front["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
    assert not front["spec"]["selector"].items() <= pods.items(), "clients reach the gateway, not the replicas"
    config = gateway_config(docs)
    assert config.discover == f"{replicas['metadata']['name']}.serving.svc.cluster.local:30000"
    assert (config.api_key, config.replica_api_key) == ("<RADIXCLUSTER_API_KEY>", "<RADIXCLUSTER_API_KEY>")
    assert (config.routing.policy, config.routing.load_weight) == ("cache-aware", 0.25)
    assert gateway["spec"]["replicas"] == 2
    # the replicas publish their tree events where the headless Service says
    assert server_args(docs).kv_events_address == "tcp://0.0.0.0:5557"
    events = next(p for p in replicas["spec"]["ports"] if p["name"] == "events")
    server_ports = {p["name"]: p["containerPort"] for p in container(server_deployment(docs), "server")["ports"]}
    assert server_ports["events"] == events["port"] == 5557
    # Prometheus scrapes every replica, and from the gateway only its own metrics
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    assert (
        monitors["rc-radixcluster"]["spec"]["selector"]["matchLabels"].items() <= replicas["metadata"]["labels"].items()
    )
    gateway_monitor = monitors["rc-radixcluster-gateway"]
    assert gateway_monitor["spec"]["selector"]["matchLabels"].items() <= front["metadata"]["labels"].items()
    (keep,) = gateway_monitor["spec"]["endpoints"][0]["metricRelabelings"]
    assert (keep["action"], keep["regex"]) == ("keep", "radixcluster_gateway_.*")
    assert not by_kind(helm.template(CHART), "ServiceMonitor") and len(by_kind(helm.template(CHART), "Deployment")) == 1


def test_no_key_means_no_auth_anywhere(helm: Helm) -> None:
    docs = helm.template(
        CHART, sets=("apiKey.create=false", "monitoring.serviceMonitor.enabled=true", "probes.readiness.path=/health")
    )
    assert server_args(docs).api_key is None and not by_kind(docs, "Secret")
    assert "RADIXCLUSTER_API_KEY" not in {e["name"] for e in container(one(docs, "Deployment"), "server")["env"]}
    assert "authorization" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert (
        '127.0.0.1:30000/health"'
        in container(server_deployment(docs), "server")["readinessProbe"]["exec"]["command"][-1]
    )


def test_admin_key_and_tenants_come_from_their_secrets(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The admin key reaches the server and the gateway through their environment, the tenants'
    keys file as a read-only Secret volume that --api-key-file names."""
    read: list[str] = []

    def tenants_file(path: str) -> dict[str, str]:  # the file is the Secret's, in the pod
        read.append(path)
        return {"tenant-key": "acme"}

    monkeypatch.setattr("radixcluster.server_args.load_tenant_keys", tenants_file)
    monkeypatch.setattr("radixcluster.gateway_args.load_tenant_keys", tenants_file)
    docs = helm.template(CHART, (KEYS_VALUES,))
    path = "/etc/radixcluster/tenants/keys.json"
    assert server_args(docs).api_key_file == path
    config = gateway_config(docs)
    assert config.tenant_keys == {"tenant-key": "acme"} and config.replica_api_key == "<RADIXCLUSTER_API_KEY>"
    assert read == [path, path]
    for workload, name in ((server_deployment(docs), "server"), (component(docs, "Deployment", "gateway"), "gateway")):
        pod = workload["spec"]["template"]["spec"]
        c = container(workload, name)
        admin = next(e for e in c["env"] if e["name"] == "RADIXCLUSTER_ADMIN_API_KEY")
        assert admin["valueFrom"]["secretKeyRef"] == {"name": "rc-admin", "key": "admin-api-key"}
        assert not any("admin" in arg for arg in c["args"])
        volume = next(v for v in pod["volumes"] if v["name"] == "tenants")
        assert volume["secret"] == {"secretName": "rc-tenants", "items": [{"key": "keys.json", "path": "keys.json"}]}
        mount = next(m for m in c["volumeMounts"] if m["name"] == "tenants")
        assert mount == {"name": "tenants", "mountPath": "/etc/radixcluster/tenants", "readOnly": True}
    assert not any("ADMIN" in e["name"] for e in container(server_deployment(helm.template(CHART)), "server")["env"]), (
        "no admin key by default"
    )


def test_tenants_need_a_key_for_the_charts_own_calls(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tenants' keys every call needs a key: the readiness check and the gateway's calls to
    the replicas take the API key, else the admin key; with neither the chart refuses (the
    gateway would refuse to start)."""
    without_api_key = ("apiKey.create=false", "tenants.existingSecret=rc-tenants")
    with pytest.raises(RuntimeError, match="tenants.existingSecret needs a key"):
        helm.template(CHART, (GATEWAY_VALUES,), sets=without_api_key)
    docs = helm.template(CHART, (GATEWAY_VALUES,), sets=(*without_api_key, "adminApiKey.existingSecret=rc-admin"))
    readiness = container(server_deployment(docs), "server")["readinessProbe"]["exec"]["command"][-1]
    assert 'os.environ.get("RADIXCLUSTER_ADMIN_API_KEY")' in readiness
    monkeypatch.setattr("radixcluster.gateway_args.load_tenant_keys", lambda path: {"tenant-key": "acme"})
    config = gateway_config(docs)
    assert (config.api_key, config.replica_api_key) == (None, "<RADIXCLUSTER_ADMIN_API_KEY>")
    # Prometheus too: every replica's and the gateway's /metrics take the admin key
    for monitor in by_kind(docs, "ServiceMonitor"):
        credentials = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]
        assert credentials == {"name": "rc-admin", "key": "admin-api-key"}


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


def test_a_gateway_pod_drains_as_a_replica_does(helm: Helm) -> None:
    """Out of its Service's endpoints before SIGTERM, then the replicas' --shutdown-timeout for
    its streams, within the same grace period (a gateway rollout lost requests to 503s and, past
    30 s, its streams to SIGKILL)."""
    sets = ("server.shutdownTimeout=45", "terminationGracePeriodSeconds=70")
    docs = helm.template(CHART, (GATEWAY_VALUES,), sets=sets)
    gateway = component(docs, "Deployment", "gateway")
    assert container(gateway, "gateway")["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 70
    assert gateway_config(docs).shutdown_timeout_s == 45


def test_the_self_healing_settings_reach_the_server(helm: Helm) -> None:
    """The hung-group watchdog and the restart budget: the server's defaults unless set."""
    defaults = server_args(helm.template(CHART))
    assert (defaults.step_timeout, defaults.max_worker_restarts) == (600, 3)
    sets = ("server.stepTimeout=120", "server.maxWorkerRestarts=0")
    custom = server_args(helm.template(CHART, sets=sets))
    assert (custom.step_timeout, custom.max_worker_restarts) == (120, 0)


def test_bad_values_are_refused(helm: Helm) -> None:
    for sets in (
        ("server.tpSize=0",),
        ("server.stepTimeout=0",),
        ("model.source=s3",),
        ("model.source=pvc",),
        ("server.schedulePolicy=random",),
        ("gateway.policy=random",),
        ("gateway.eventsPort=0",),
    ):
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
