"""deploy/kubernetes without a cluster: the kustomize rendering of every overlay (committed in
deploy/kubernetes/rendered/, checked against a fresh `kubectl kustomize` where kubectl is installed),
validate every object against the OpenAPI schemas of a current Kubernetes release (kubernetes-validate)
or, for KEDA and Prometheus-operator objects, against their CRD schemas (tests/deploy/crd_schemas), and
check the invariants a model server needs (probes, drain, security, resources, selectors, autoscaling)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from scripts.render_kubernetes import TARGETS, kustomize_command, rendered_path
from scripts.render_kubernetes import render as render_with_kustomize
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE_ROOT = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "int8")
# Current release (the newest kubernetes-validate ships) and the oldest one the manifests promise to run on.
K8S_VERSIONS = ("1.37.0", "1.32.0")
CRD_SCHEMAS = ROOT / "tests" / "deploy" / "crd_schemas"
IMAGE_UID = 10001  # the Dockerfile's user `app`
CAPACITY = ROOT / "bench_results" / "capacity.json"
APP_LABEL = {"app.kubernetes.io/name": "transformer-serving"}


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """The committed rendering of deploy/kubernetes/<target> (see test_rendered_manifests_are_current)."""
    text = rendered_path(target).read_text()
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_manifests_are_current(target: str) -> None:
    """Kustomize's output today equals the committed file that every other test here checks."""
    if kustomize_command(target) is None:
        pytest.skip("kubectl/kustomize not installed: the committed rendering is checked, its freshness is not")
    fresh = [doc for doc in yaml.safe_load_all(render_with_kustomize(target)) if doc]
    assert fresh == list(render(target)), (
        f"deploy/kubernetes/rendered/ is stale for {target}: run `python -m scripts.render_kubernetes`"
    )


def objects(target: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in render(target) if o["kind"] == kind]


def one(target: str, kind: str) -> dict[str, Any]:
    found = objects(target, kind)
    assert len(found) == 1, f"{target}: expected one {kind}, found {len(found)}"
    return found[0]


def strict(schema: Any) -> Any:
    """A CRD schema that, like the API server's pruning, rejects fields it does not declare."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Validator]:
    validators: dict[tuple[str, str], jsonschema.Validator] = {}
    for path in CRD_SCHEMAS.glob("*.json"):
        doc = json.loads(path.read_text())
        validators[(doc["apiVersion"], doc["kind"])] = jsonschema.Draft7Validator(strict(doc["schema"]))
    return validators


def container(target: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = one(target, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def settings_env(target: str) -> dict[str, str]:
    data: dict[str, str] = one(target, "ConfigMap")["data"]
    return data


def pod_labels(target: str) -> dict[str, str]:
    labels: dict[str, str] = one(target, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity in base units (cores or bytes)."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9, "": 1}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match is not None, f"not a quantity: {value!r}"
    number, unit = match.groups()
    return float(number) * units[unit]


# --- rendering and schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_renders_the_expected_objects(target: str) -> None:
    kinds = sorted(o["kind"] for o in render(target))
    expected = ["ConfigMap", "Deployment", "Ingress", "Namespace", "NetworkPolicy", "PodDisruptionBudget"]
    expected += ["Service", "ServiceAccount"]
    expected += ["HorizontalPodAutoscaler"] if target == "base" else ["ScaledObject", "ServiceMonitor"]
    assert kinds == sorted(expected)
    namespaced = [o for o in render(target) if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {one(target, "Namespace")["metadata"]["name"]}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_object_matches_its_schema(target: str, version: str) -> None:
    checked = 0
    for obj in render(target):
        key = (obj["apiVersion"], obj["kind"])
        if key in crd_validators():
            errors = sorted(crd_validators()[key].iter_errors(obj), key=str)
            assert not errors, f"{obj['kind']}/{obj['metadata']['name']}: {errors[0].message} at {errors[0].json_path}"
        else:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {exc.message}")
        checked += 1
    assert checked == len(render(target)) >= 9


def test_the_crd_schemas_reject_a_misspelt_field() -> None:
    """The strict CRD check can fail: an unknown field in a ScaledObject is an error, as in the API server."""
    scaled = json.loads(json.dumps(one("overlays/cpu", "ScaledObject")))
    scaled["spec"]["maxReplicas"] = 3  # the real field is maxReplicaCount
    validator = crd_validators()[("keda.sh/v1alpha1", "ScaledObject")]
    assert any("maxReplicas" in e.message for e in validator.iter_errors(scaled))


# --- the Deployment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_probes_ready_for_startup_and_readiness_health_for_liveness(target: str) -> None:
    c = container(target)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("startupProbe", "/ready"), ("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert c[probe]["httpGet"]["path"] == path, probe
        assert c[probe]["httpGet"]["port"] in ports, probe
    startup = c["startupProbe"]
    # Model load and warm-up take seconds on a warm node; pulling layers and a cold page cache take longer.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 180
    # A liveness probe must not restart a pod that answers /health within its timeout.
    assert c["livenessProbe"]["failureThreshold"] >= 3


@pytest.mark.parametrize("target", TARGETS)
def test_grace_period_outlasts_prestop_and_the_drain(target: str) -> None:
    pod = one(target, "Deployment")["spec"]["template"]["spec"]
    pre_stop = container(target)["lifecycle"]["preStop"]
    command = pre_stop["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    drain_s = float(settings_env(target)["SERVE_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_s + drain_s + 15, (pre_stop_s, drain_s)


@pytest.mark.parametrize("target", TARGETS)
def test_runs_unprivileged_on_a_read_only_root(target: str) -> None:
    pod = one(target, "Deployment")["spec"]["template"]["spec"]
    c = container(target)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    # The only writable place is /tmp, in memory and bounded.
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert volume["emptyDir"]["sizeLimit"]
    assert one(target, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("target", TARGETS)
def test_resources_are_set_and_hold_the_measured_memory(target: str) -> None:
    resources = container(target)["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind
    # Guaranteed QoS: no overcommit of memory, a whole number of cores.
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert quantity(resources["requests"]["cpu"]) == quantity(resources["limits"]["cpu"]) >= 1
    assert quantity(resources["limits"]["cpu"]).is_integer()
    if target.endswith("gpu"):
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        return
    measured = json.loads(CAPACITY.read_text())["variants"]
    variant = "int8" if target.endswith("int8") else "fp32"
    peak_rss = measured[variant]["server_peak_rss_mb"] * 2**20
    # /tmp (memory-backed, sizeLimit) counts against the limit too.
    assert quantity(resources["limits"]["memory"]) >= 1.5 * peak_rss + 64 * 2**20, (variant, peak_rss / 2**20)


@pytest.mark.parametrize("target", TARGETS)
def test_intra_op_threads_follow_the_cpu_limit(target: str) -> None:
    c = container(target)
    threads = next(e for e in c["env"] if e["name"] == "SERVE_INTRA_OP_THREADS")
    ref = threads["valueFrom"]["resourceFieldRef"]
    assert ref == {"containerName": c["name"], "resource": "limits.cpu", "divisor": "1"}
    assert "SERVE_INTRA_OP_THREADS" not in settings_env(target)


@pytest.mark.parametrize("target", TARGETS)
def test_settings_are_valid_and_the_api_key_comes_from_a_secret(target: str) -> None:
    env = settings_env(target)
    deployment = one(target, "Deployment")
    c = container(target)
    assert [s["configMapRef"]["name"] for s in c["envFrom"]] == [one(target, "ConfigMap")["metadata"]["name"]]
    # The server's own validation of these values (artifacts_dir: this checkout's, as the image has them).
    fields = {name.removeprefix("SERVE_").lower(): value for name, value in env.items()}
    assert set(fields) <= set(Settings.model_fields), set(fields) - set(Settings.model_fields)
    Settings.model_validate({**fields, "artifacts_dir": ROOT / "artifacts"})
    assert "SERVE_API_KEY" not in env
    key = next(e for e in c["env"] if e["name"] == "SERVE_API_KEY")
    assert set(key) == {"name", "valueFrom"} and key["valueFrom"]["secretKeyRef"]["name"]
    assert not objects(target, "Secret"), "a Secret with a key in the repository"
    assert "replicas" not in deployment["spec"], "a fixed replica count fights the autoscaler"


@pytest.mark.parametrize("target", TARGETS)
def test_pods_spread_across_nodes(target: str) -> None:
    constraints = one(target, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"]
    by_node = next(t for t in constraints if t["topologyKey"] == "kubernetes.io/hostname")
    assert by_node["whenUnsatisfiable"] == "DoNotSchedule" and by_node["maxSkew"] == 1
    assert all(selects(t["labelSelector"]["matchLabels"], pod_labels(target)) for t in constraints)


# --- Service, ingress, disruption budget, network policy, metrics -----------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_service_ingress_and_monitoring_reach_the_pods(target: str) -> None:
    labels = pod_labels(target)
    port_names = {p["name"] for p in container(target)["ports"]}
    service = one(target, "Service")
    assert selects(service["spec"]["selector"], labels)
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    backend = one(target, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    annotations = one(target, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    if target == "base":
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) in {p["containerPort"] for p in container(target)["ports"]}
    else:  # scraped through the ServiceMonitor, not twice
        assert annotations["prometheus.io/scrape"] == "false"
        monitor = one(target, "ServiceMonitor")
        assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        assert [e["path"] for e in monitor["spec"]["endpoints"]] == ["/metrics"]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("target", TARGETS)
def test_disruption_budget_keeps_a_pod_serving(target: str) -> None:
    pdb = one(target, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(target))
    assert pdb["spec"]["maxUnavailable"] == 1
    assert min_replicas(target) >= 2, "with one replica the budget would block every node drain"


@pytest.mark.parametrize("target", TARGETS)
def test_network_policy_admits_only_the_ingress_controller_and_prometheus(target: str) -> None:
    policy = one(target, "NetworkPolicy")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod_labels(target))
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    port_names = {p["name"] for p in container(target)["ports"]}
    sources = []
    for rule in policy["ingress"]:
        assert rule["ports"] and {p["port"] for p in rule["ports"]} <= port_names
        for peer in rule["from"]:  # an empty `from` or a peer without both selectors would admit too much
            assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"]
            sources.append(peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"])
    assert sorted(sources) == ["ingress-nginx", "prometheus"]


# --- autoscaling -------------------------------------------------------------------------------------


def min_replicas(target: str) -> int:
    count: int
    if target == "base":
        count = one(target, "HorizontalPodAutoscaler")["spec"]["minReplicas"]
    else:
        count = one(target, "ScaledObject")["spec"]["minReplicaCount"]
    return count


def test_base_scales_on_cpu() -> None:
    hpa = one("base", "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "transformer-serving"}
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_scale_on_queue_depth_with_one_autoscaler(overlay: str) -> None:
    target = f"overlays/{overlay}"
    assert not objects(target, "HorizontalPodAutoscaler"), "KEDA's HPA and a second one would fight"
    scaled = one(target, "ScaledObject")["spec"]
    deployment = one(target, "Deployment")
    assert scaled["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    triggers = {t["type"]: t for t in scaled["triggers"]}
    queue = triggers["prometheus"]
    assert queue["metricType"] == "AverageValue" and float(queue["metadata"]["threshold"]) > 0
    query = queue["metadata"]["query"]
    assert query.startswith("sum(serve_queue_depth{"), query
    # The query must look at this deployment's pods, in the namespace the overlay deploys to.
    assert f'namespace="{deployment["metadata"]["namespace"]}"' in query
    assert f'pod=~"{deployment["metadata"]["name"]}-.*"' in query
    assert ("cpu" in triggers) == (overlay != "gpu")
    # The same limits and pace as the base's CPU autoscaler.
    base = one("base", "HorizontalPodAutoscaler")["spec"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (base["minReplicas"], base["maxReplicas"])
    assert scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == base["behavior"]
    if "cpu" in triggers:
        assert triggers["cpu"]["metricType"] == "Utilization" and 0 < int(triggers["cpu"]["metadata"]["value"]) <= 100


@pytest.mark.parametrize(("target", "variant"), [("overlays/cpu", "fp32"), ("overlays/int8", "int8")])
def test_autoscaler_targets_come_from_the_capacity_model(target: str, variant: str) -> None:
    """docs/deployment.md "Scale out": benchmarks/capacity.py turns the measured replica into these two targets."""
    plan = json.loads(CAPACITY.read_text())["variants"][variant]["plan"]
    triggers = {t["type"]: t["metadata"] for t in one(target, "ScaledObject")["spec"]["triggers"]}
    assert int(triggers["cpu"]["value"]) == plan["hpa_cpu_utilization_percent"]
    assert float(triggers["prometheus"]["threshold"]) == plan["hpa_queue_depth_per_pod"]
    if variant == "fp32":
        hpa = one("base", "HorizontalPodAutoscaler")["spec"]["metrics"][0]["resource"]["target"]
        assert hpa["averageUtilization"] == plan["hpa_cpu_utilization_percent"]


def test_gpu_overlay_uses_the_gpu_image_and_device() -> None:
    c = container("overlays/gpu")
    assert c["image"].endswith(":gpu") and settings_env("overlays/gpu")["SERVE_DEVICE"] == "cuda"
    tolerations = one("overlays/gpu", "Deployment")["spec"]["template"]["spec"]["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)
    assert container("overlays/cpu")["image"].endswith(":cpu")


def test_int8_overlay_serves_the_int8_graphs() -> None:
    assert settings_env("overlays/int8")["SERVE_QUANTIZATION"] == "int8"
    assert settings_env("overlays/cpu")["SERVE_QUANTIZATION"] == "none"
    # A settings change gives the ConfigMap a new name, so the pods roll.
    assert one("overlays/int8", "ConfigMap")["metadata"]["name"] != one("overlays/cpu", "ConfigMap")["metadata"]["name"]

