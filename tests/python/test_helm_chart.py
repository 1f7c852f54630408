"""deploy/helm/torchtpu-cpp offline (issue #21): `helm lint --strict` and `helm template` for
each values file, the rendered core kinds through `kubernetes-validate --strict`, the custom
resources (and the endpoint picker's configuration) through `check-jsonschema` against the
schemas in deploy/helm/schemas, and the wiring a router depends on: Pod labels, probes, the pool's
selector, the drain. TORCHTPU_HELM names the helm binary (scripts/setup.sh builds it)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "torchtpu-cpp"
SCHEMAS = ROOT / "deploy" / "helm" / "schemas"
BIN = Path(sys.executable).parent
HELM = os.environ.get("TORCHTPU_HELM", "")
KUBERNETES_VERSION = "1.33.0"  # GKE's regular channel, late 2026

VALUES = {
    "defaults": [],
    "gke-tpu-v5e": ["-f", str(CHART.parent / "values-gke-tpu-v5e.yaml")],
    "cpu": ["-f", str(CHART.parent / "values-cpu.yaml")],
}
CORE = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
CUSTOM = {
    "InferencePool": "inferencepool.json",
    "HTTPRoute": "httproute.json",
    "HealthCheckPolicy": "healthcheckpolicy.json",
    "PodMonitoring": "podmonitoring.json",
}
# The names torchtpu-cpp's /metrics exports (tests/go reads them with the picker's own code).
METRICS = {
    "queuedRequestsSpec": "torchtpu_queue_depth",
    "runningRequestsSpec": "torchtpu_running_requests",
    "kvUsageSpec": "torchtpu_kv_cache_usage_ratio",
    "cacheInfoSpec": "torchtpu_cache_config_info",
    "loraSpec": "torchtpu_lora_requests_info",
}


def helm(*args, check=True):
    if not HELM:
        pytest.fail("set TORCHTPU_HELM to the helm binary (ctest does)")
    return subprocess.run(
        [HELM, *args], capture_output=True, text=True, check=check, timeout=120
    )


def render(values, *more):
    out = helm("template", "tt", str(CHART), "--kube-version", KUBERNETES_VERSION,
               *VALUES[values], *more).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def validate_core(doc, tmp_path):
    path = tmp_path / f"{doc['kind']}-{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.run(
        [BIN / "kubernetes-validate", "--strict", "--kubernetes-version",
         KUBERNETES_VERSION, str(path)],
        capture_output=True, text=True, timeout=120,
    )


def validate_schema(doc, schema, tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return subprocess.run(
        [BIN / "check-jsonschema", "--schemafile", str(SCHEMAS / schema), str(path)],
        capture_output=True, text=True, timeout=120,
    )


def by_kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} rendered"
    return found[0]


def serve_module():
    """`python -m torchtpu_cpp.serve`'s module, from the source tree (its argument parser needs no
    build)."""
    spec = importlib.util.spec_from_file_location(
        "serve", ROOT / "src" / "python" / "torchtpu_cpp" / "serve.py"
    )
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    return serve


def epp_config(docs):
    configmap = by_kind(docs, "ConfigMap")
    return yaml.safe_load(configmap["data"]["epp-config.yaml"])


@pytest.mark.parametrize("values", VALUES)
def test_lint_is_clean(values):
    result = helm("lint", "--strict", str(CHART), *VALUES[values], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_kind_is_valid(values, tmp_path):
    docs = render(values)
    kinds = {d["kind"] for d in docs}
    assert kinds <= CORE | set(CUSTOM), f"kinds without a check: {kinds - CORE - set(CUSTOM)}"
    assert {"Deployment", "InferencePool", "ConfigMap", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= kinds
    for i, doc in enumerate(docs):
        if doc["kind"] in CORE:
            result = validate_core(doc, tmp_path)
        else:
            result = validate_schema(doc, CUSTOM[doc["kind"]], tmp_path, f"cr{i}")
        assert result.returncode == 0, f"{doc['kind']}: {result.stdout}{result.stderr}"
    result = validate_schema(epp_config(docs), "endpointpickerconfig.json", tmp_path, "epp")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES)
def test_the_picker_finds_the_pods_and_reads_torchtpu_names(values):
    docs = render(values)
    deployment = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pool = by_kind(docs, "InferencePool")
    for key, value in pool["spec"]["selector"]["matchLabels"].items():
        assert pod_labels[key] == value, key
    port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert pool["spec"]["targetPorts"] == [{"number": port["containerPort"]}]
    config = epp_config(docs)
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    params = extractor["parameters"]
    (engine,) = params["engineConfigs"]
    assert pod_labels[params["engineLabelKey"]] == engine["name"]
    assert pod_labels["llm-d.ai/engine-type"] == engine["name"]
    assert pod_labels["llm-d.ai/inference-serving"] == "true"
    assert {k: engine[k] for k in METRICS} == METRICS
    scrape = next(p for p in config["plugins"] if p["type"] == "metrics-data-source")
    assert scrape["parameters"]["path"] == "/metrics"
    # The scorers the profile names are declared plugins.
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        for ref in profile["plugins"]:
            assert ref["pluginRef"] in declared, ref


@pytest.mark.parametrize("values", VALUES)
def test_probes_drain_budget_and_autoscaler(values):
    docs = render(values)
    deployment = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    command = container["command"]
    grace = 15
    assert command[:2] == ["torchtpu-cpp", "serve"] or command[:3] == [
        "python3", "-m", "torchtpu_cpp.serve"]
    assert f"--drain-grace={grace}" in command
    assert "lifecycle" not in container
    assert "--host=0.0.0.0" in command
    assert pod["terminationGracePeriodSeconds"] > grace
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": deployment["metadata"]["name"]}
    (metric,) = hpa["metrics"]
    assert "torchtpu_queue_depth" in metric["pods"]["metric"]["name"]


def test_tpu_values_put_one_replica_on_each_v5e_chip():
    docs = render("gke-tpu-v5e")
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "1x1",
    }
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["google.com/tpu"] == 1
    assert resources["requests"]["google.com/tpu"] == 1
    assert {"key": "google.com/tpu", "operator": "Equal", "value": "present",
            "effect": "NoSchedule"} in pod["tolerations"]
    assert "--device=tpu" in pod["containers"][0]["command"]
    check = by_kind(docs, "HealthCheckPolicy")["spec"]["default"]["config"]
    assert check["httpHealthCheck"]["requestPath"] == "/health"


@pytest.mark.parametrize("values", ["defaults", "gke-tpu-v5e"])
def test_aliases_and_vllm_names_reach_the_command_line(values):
    """Both launchers (the CLI, and the Python host the TPU values use) take them."""
    docs = render(values, "--set", "model.aliases={gemma,publishers/ns/models/gemma}",
                  "--set", "server.vllmMetricNames=true")
    command = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--served-model-name=gemma" in command
    assert "--served-model-name=publishers/ns/models/gemma" in command
    assert "--metrics-compat=vllm" in command


def test_the_python_launcher_parses_the_rendered_command_line():
    """The TPU values run `python -m torchtpu_cpp.serve`: every flag the chart writes is one it
    takes, with the scheduler's values."""
    serve = serve_module()
    docs = render("gke-tpu-v5e", "--set", "server.parallel=8", "--set", "server.cacheMb=256")
    command = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python3", "-m", "torchtpu_cpp.serve"]
    args = serve._parse_args(command[3:])
    assert (args.parallel, args.cache_mb, args.max_queue) == (8, 256, 16)
    assert (args.step_tokens, args.pass_rows, args.int4_activation_bits) == (0, 0, 16)
    assert (args.emb4, args.constrain_tools) == ("", False)
    docs = render("gke-tpu-v5e", "--set", "server.stepTokens=200", "--set", "server.passRows=4",
                  "--set", "server.int4ActivationBits=8", "--set", "server.constrainTools=true",
                  "--set", "model.emb4=/models/emb4")
    command = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    args = serve._parse_args(command[3:])
    assert (args.step_tokens, args.pass_rows, args.int4_activation_bits) == (200, 4, 8)
    assert (args.emb4, args.constrain_tools) == ("/models/emb4", True)


ADAPTERS = '[{"name":"sql","dir":"/adapters/sql"},{"name":"chat","dir":"/adapters/chat"}]'


@pytest.mark.parametrize("values", VALUES)
def test_lora_adapters_reach_the_command_line_and_the_pickers_scorers(values, tmp_path):
    """Each launcher takes the adapters as `serve` does (`--lora NAME=DIR`), and with adapters the
    picker's profile adds the lora-affinity scorer, a configuration its schema accepts; without,
    the profile is the default one."""
    serve = serve_module()
    docs = render(values, "--set-json", f"model.lora={ADAPTERS}")
    command = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert [a for a in command if a.startswith("--lora")] == [
        "--lora=sql=/adapters/sql",
        "--lora=chat=/adapters/chat",
    ]
    if command[:3] == ["python3", "-m", "torchtpu_cpp.serve"]:
        assert serve._parse_args(command[3:]).lora == ["sql=/adapters/sql", "chat=/adapters/chat"]
    config = epp_config(docs)
    (profile,) = config["schedulingProfiles"]
    refs = {ref["pluginRef"]: ref.get("weight") for ref in profile["plugins"]}
    assert refs["lora-affinity-scorer"] == 1
    assert any(p["type"] == "lora-affinity-scorer" for p in config["plugins"])
    result = validate_schema(config, "endpointpickerconfig.json", tmp_path, "epp")
    assert result.returncode == 0, result.stdout + result.stderr
    plain = epp_config(render(values))
    assert all(p["type"] != "lora-affinity-scorer" for p in plain["plugins"])
    missing = helm("template", "tt", str(CHART), "--kube-version", KUBERNETES_VERSION,
                   "--set-json", 'model.lora=[{"name":"sql"}]', check=False)
    assert "model.lora[].dir is required" in missing.stderr


@pytest.mark.parametrize("values", VALUES)
def test_runtime_lora_reaches_the_command_line_and_the_pickers_scorers(values):
    """model.runtimeLora opens the load and unload routes (`--runtime-lora`, with `--max-loras`),
    and the picker scores Pods by the adapters in use even when none is listed at start."""
    serve = serve_module()
    docs = render(values, "--set", "model.runtimeLora=true", "--set", "model.maxLoras=4")
    command = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--runtime-lora" in command and "--max-loras=4" in command
    if command[:3] == ["python3", "-m", "torchtpu_cpp.serve"]:
        args = serve._parse_args(command[3:])
        assert (args.runtime_lora, args.max_loras) == (True, 4)
    (profile,) = epp_config(docs)["schedulingProfiles"]
    assert "lora-affinity-scorer" in {ref["pluginRef"] for ref in profile["plugins"]}
    plain = by_kind(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith(("--runtime-lora", "--max-loras")) for a in plain["command"])


def test_the_chart_refuses_an_unknown_launcher():
    result = helm("template", "tt", str(CHART), "--kube-version", KUBERNETES_VERSION,
                  "--set", "launcher=docker", check=False)
    assert 'launcher must be cli or python, got "docker"' in result.stderr


def test_the_validators_catch_a_misspelt_field(tmp_path):
    docs = render("defaults")
    deployment = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    result = validate_core(deployment, tmp_path)
    assert result.returncode != 0 and "readinesProbe" in result.stdout + result.stderr
    pool = by_kind(docs, "InferencePool")
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    result = validate_schema(pool, "inferencepool.json", tmp_path, "pool")
    assert result.returncode != 0
