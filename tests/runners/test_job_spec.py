"""The Kubernetes objects ax ships and creates, checked without a cluster.

- Every document in ``deploy/k8s/`` and every Job ``ax k8s job`` prints validates
  against the Kubernetes v1.37.0 schemas in strict mode (no unknown field anywhere).
- The Job of a node run holds what the runner relies on: no retries by Kubernetes, the
  node timeout as its deadline, a name stable per (task, node, fence), valid labels
  whatever the ids, no token in its environment or arguments, a locked-down pod.
- The deployment is least-privilege: the executor's Role grants exactly what the runner
  calls, nothing is cluster-wide, Secrets are referenced and never committed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from axengine.cli import main
from axengine.dag import load_dag
from axengine.errors import InputError
from axengine.runners.job import (
    ENTRY_COMMAND,
    TOKEN_FILE,
    JobSettings,
    build_job,
    job_name,
    label_value,
    load_job_settings,
)
from executors.contract import NodeRequest

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DAGS = sorted((ROOT / "dags").glob("*.yaml"))
VERSION = "1.37.0"

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
AWKWARD_IDS = ["T-Upper_Case", "a_b__c", "x" * 200, "UPPER_" * 40, "-lead-and-trail-",
               "ünï/cødé:id", "___", "1"]


def validate(manifest: dict[str, Any]) -> None:
    """Strict schema validation; a failure names the path inside the manifest."""
    try:
        kubernetes_validate.validate(manifest, VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']}: {path}: "
                    f"{exc.message}")


# ------------------------------------------------------------------ deploy/k8s manifests


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path.name, doc


MANIFESTS = list(manifests())
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())


def find(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(("file", "doc"), MANIFESTS,
                         ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in MANIFESTS])
def test_every_manifest_validates_strictly(file: str, doc: dict[str, Any]) -> None:
    validate(doc)
    if doc["kind"] != "Namespace":
        assert doc["metadata"]["namespace"] == "ax", file


def test_the_kustomization_lists_every_file() -> None:
    listed = KUSTOMIZATION["resources"]
    present = sorted(p.name for p in K8S.iterdir() if p.name != "kustomization.yaml")

    assert sorted(listed) == present
    assert len(set(listed)) == len(listed)
    assert KUSTOMIZATION["namespace"] == "ax"
    assert {image["name"] for image in KUSTOMIZATION["images"]} >= {"ax"}


def test_nothing_is_cluster_wide_and_no_secret_is_committed() -> None:
    kinds = {doc["kind"] for path in (ROOT / "deploy").rglob("*.y*ml")
             for doc in yaml.safe_load_all(path.read_text())
             if isinstance(doc, dict) and "kind" in doc}

    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Secret"}, kinds


def test_the_executor_role_grants_exactly_what_the_runner_calls() -> None:
    roles = [d for _, d in MANIFESTS if d["kind"] in ("Role", "RoleBinding")]
    role, binding = find("Role", "ax-executor"), find("RoleBinding", "ax-executor")

    assert len(roles) == 2
    grants = {(group, resource, verb) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]
              for verb in rule["verbs"]}
    assert grants == (
        {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
        | {("", r, v) for r in ("pods", "pods/log") for v in ("get", "list", "watch")})
    assert not any("resourceNames" in rule or "nonResourceURLs" in rule
                   for rule in role["rules"])
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "ax-executor"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ax-executor",
                                    "namespace": "ax"}]


def test_only_the_executor_gets_a_kubernetes_api_token() -> None:
    accounts = {d["metadata"]["name"]: d for _, d in MANIFESTS if d["kind"] == "ServiceAccount"}
    workloads = [d for _, d in MANIFESTS if d["kind"] in ("Deployment", "StatefulSet")]

    assert {n for n, a in accounts.items() if a["automountServiceAccountToken"]} == \
        {"ax-executor"}
    for doc in workloads:
        spec = pod_spec(doc)
        assert spec["serviceAccountName"] in accounts
        assert spec["automountServiceAccountToken"] is (
            doc["metadata"]["name"] == "ax-executor"), doc["metadata"]["name"]


def test_every_pod_is_locked_down() -> None:
    for doc in (d for _, d in MANIFESTS if d["kind"] in ("Deployment", "StatefulSet")):
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert {"requests", "limits"} <= set(container["resources"])
            assert not any("secretKeyRef" in str(e) for e in container.get("env", []))


def test_etcd_is_a_three_member_statefulset_behind_a_headless_service() -> None:
    etcd, service = find("StatefulSet", "etcd"), find("Service", "etcd")
    args = pod_spec(etcd)["containers"][0]["args"]
    members = next(a for a in args if a.startswith("--initial-cluster="))

    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["serviceName"] == "etcd"
    assert service["spec"]["clusterIP"] == "None"
    assert members.count("=http://etcd-") == 3
    assert "--max-txn-ops=20000" in args


def command(doc: dict[str, Any]) -> list[str]:
    cmd: list[str] = pod_spec(doc)["containers"][0]["command"]
    return cmd


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_api_runs_two_probed_replicas_with_a_disruption_budget() -> None:
    api, budget = find("Deployment", "ax-api"), find("PodDisruptionBudget", "ax-api")
    container = pod_spec(api)["containers"][0]
    cmd = command(api)

    assert api["spec"]["replicas"] == 2
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert budget["spec"]["selector"] == api["spec"]["selector"]
    assert cmd[:2] == ["ax", "api"]
    assert option(cmd, "--store").count("etcd-") == 3
    assert "password_file=" in option(cmd, "--queue")
    assert "--insecure-no-auth" not in cmd and "--allow-insecure-tokens-file" not in cmd


def test_the_executor_outlives_its_grace_period_and_reads_the_job_settings() -> None:
    executor = find("Deployment", "ax-executor")
    cmd = command(executor)
    mounts = {m["mountPath"]: m["name"] for m in pod_spec(executor)["containers"][0][
        "volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(executor)["volumes"]}

    assert cmd[:2] == ["ax", "executor"]
    assert pod_spec(executor)["terminationGracePeriodSeconds"] > float(option(cmd, "--grace"))
    assert "--token" not in cmd
    settings_file = Path(option(cmd, "--job-settings"))
    volume = volumes[mounts[str(settings_file.parent)]]
    assert volume["configMap"]["name"] == "ax-job-settings"
    assert settings_file.name in find("ConfigMap", "ax-job-settings")["data"]


def test_the_job_settings_configmap_loads_and_names_what_exists(tmp_path: Path) -> None:
    data = find("ConfigMap", "ax-job-settings")["data"]["job-settings.yaml"]
    (tmp_path / "job-settings.yaml").write_text(data)

    settings = load_job_settings(tmp_path / "job-settings.yaml")

    assert settings.namespace == "ax"
    assert settings.service_account_name in {
        d["metadata"]["name"] for _, d in MANIFESTS if d["kind"] == "ServiceAccount"}
    assert settings.settings_configmap == find(
        "ConfigMap", str(settings.settings_configmap))["metadata"]["name"]
    service, port = settings.api_address.split(":")
    assert int(port) in {p["port"] for p in find("Service", service)["spec"]["ports"]}
    assert settings.canary_selector == (("ax-canary", "true"),)
    # The ConfigMap manifest itself is read as the file it holds.
    assert load_job_settings(K8S / "job-settings.yaml") == settings
    (tmp_path / "other.yaml").write_text("kind: ConfigMap\ndata: {x: y}\n")
    with pytest.raises(InputError, match=r"without the key data\.job-settings\.yaml"):
        load_job_settings(tmp_path / "other.yaml")


def policy(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find("NetworkPolicy", name)["spec"]
    return spec


def test_node_pods_reach_only_the_api_grpc_port_and_dns() -> None:
    spec = policy("ax-node-pods")
    api_port = {p["name"]: p["containerPort"]
                for p in pod_spec(find("Deployment", "ax-api"))["containers"][0]["ports"]}

    assert spec["podSelector"] == {"matchLabels": {"ax-managed": "true"}}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == []
    to_api, to_dns = spec["egress"]
    assert to_api["to"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "ax-api"}}}]
    assert to_api["ports"] == [{"protocol": "TCP", "port": api_port["grpc"]}]
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert to_dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}


def sources(rule: dict[str, Any]) -> set[str]:
    return {peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
            for peer in rule["from"]}


def test_etcd_and_redis_admit_only_their_clients() -> None:
    etcd, redis = policy("etcd"), policy("redis")

    clients, peers = etcd["ingress"]
    assert sources(clients) == {"ax-api"}
    assert [p["port"] for p in clients["ports"]] == [2379]
    assert sources(peers) == {"etcd"}
    (queue,) = redis["ingress"]
    assert sources(queue) == {"ax-api", "ax-executor"}
    assert [p["port"] for p in queue["ports"]] == [6379]


def test_secrets_are_referenced_and_documented() -> None:
    referenced = {v["secret"]["secretName"] for _, d in MANIFESTS
                  if d["kind"] in ("Deployment", "StatefulSet")
                  for v in pod_spec(d).get("volumes", []) if "secret" in v}
    referenced.add(JobSettings().token_secret)
    docs = (ROOT / "docs" / "deployment.md").read_text()

    assert referenced == {"ax-redis", "ax-api-tokens", "ax-executor-token", "ax-job-token"}
    for name in referenced:
        assert f"kubectl -n ax create secret generic {name}" in docs, name


# ------------------------------------------------------------------ the Job of a node


def executor_nodes() -> list[tuple[Path, str]]:
    return [(path, nid) for path in DAGS for nid, node in load_dag(path).nodes.items()
            if node.type in ("tool_call", "llm_call")]


def k8s_job(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["k8s", "job", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    job: dict[str, Any] = yaml.safe_load(out)
    return job


def check_job(job: dict[str, Any], *, timeout: float) -> None:
    """Everything the runner and the cluster rely on in a node's Job."""
    validate(job)
    spec, meta = job["spec"], job["metadata"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}

    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert spec["backoffLimit"] == 0
    assert pod["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == timeout
    assert spec["ttlSecondsAfterFinished"] > 0
    assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63
    for labels in (meta["labels"], spec["template"]["metadata"]["labels"]):
        assert labels["ax-managed"] == "true"
        assert {"ax-task", "ax-node", "ax-fence", "ax-attempt", "ax-dag"} <= set(labels)
        assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values()), labels
    assert env["AX_TASK_ID"] == meta["annotations"]["ax-task-id"]
    assert env["AX_SNAPSHOT_KEY"] == f"/ax/snapshots/{env['AX_TASK_ID']}/{env['AX_NODE_ID']}"
    assert {"AX_FENCE", "AX_ATTEMPT", "AX_API"} <= set(env)
    assert container["command"] == list(ENTRY_COMMAND) and "args" not in container
    # The token: a file of a read-only Secret volume, never a value in env or argv.
    assert env["AX_TOKEN_FILE"] == TOKEN_FILE
    assert all("valueFrom" not in e for e in container["env"])
    assert not [n for n in env if "TOKEN" in n and n != "AX_TOKEN_FILE"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token_mount = next(m for m in mounts.values()
                       if TOKEN_FILE.startswith(m["mountPath"] + "/"))
    assert token_mount["readOnly"] is True
    assert "secret" in volumes[token_mount["name"]]
    assert "emptyDir" in volumes[next(m["name"] for m in mounts.values()
                                      if m["mountPath"] == "/tmp")]
    # The pod.
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"requests", "limits"} <= set(container["resources"])


@pytest.mark.parametrize(("dag", "node"), executor_nodes(),
                         ids=[f"{p.stem}:{n}" for p, n in executor_nodes()])
def test_ax_k8s_job_prints_a_valid_job_for_every_executor_node(
        dag: Path, node: str, capsys: pytest.CaptureFixture[str]) -> None:
    job = k8s_job(capsys, str(dag), node)

    check_job(job, timeout=load_dag(dag).nodes[node].timeout)
    assert job["metadata"]["name"] == job_name("t-dry-run", node, 1)
    assert job["metadata"]["labels"]["ax-dag"] == load_dag(dag).hash[:63]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "ax:dev"


def test_the_deployed_settings_give_valid_jobs_and_the_canary_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job-settings.yaml"
    config.write_text(find("ConfigMap", "ax-job-settings")["data"]["job-settings.yaml"])
    dag = str(ROOT / "dags" / "financial_risk_assessment.yaml")

    plain = k8s_job(capsys, dag, "parse_pdf", "--config", str(config), "--label", "team=risk")
    canary = k8s_job(capsys, dag, "parse_pdf", "--config", str(config),
                     "--label", "ax-canary=true", "--label", "team=risk")

    check_job(canary, timeout=300)
    image = [j["spec"]["template"]["spec"]["containers"][0]["image"] for j in (plain, canary)]
    assert image == ["ax:dev", "ax:canary"]
    pod = canary["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ax-job"
    assert "AX_SETTINGS_FILE" in {e["name"] for e in pod["containers"][0]["env"]}


RESOURCED = """
name: resourced
nodes:
  Fetch_Report:
    type: tool_call
    tool: echo
    timeout: 42.5
    runner: kubernetes
    resources:
      requests: {cpu: "2", memory: 256Mi}
      limits: {memory: 1Gi}
"""


def test_node_resources_are_merged_over_the_defaults(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "resourced.yaml"
    dag.write_text(RESOURCED)

    job = k8s_job(capsys, str(dag), "Fetch_Report")

    check_job(job, timeout=43)
    # The node's 2 cpu request lifts the default 1 cpu limit: never a refused pod.
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "256Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }


def test_a_node_above_the_deployment_maximum_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "greedy.yaml"
    dag.write_text(RESOURCED.replace('cpu: "2"', "cpu: 64"))

    code = main(["k8s", "job", str(dag), "Fetch_Report"])

    err = capsys.readouterr().err
    assert code == 2
    assert "resources.requests.cpu 64 is above the deployment's maximum 4" in err
    assert "max_resources.cpu" in err


@pytest.mark.parametrize("task_id", AWKWARD_IDS)
@pytest.mark.parametrize("node_id", ["Fetch_Report", "n" * 128, "_x"])
def test_awkward_ids_give_valid_names_and_labels(task_id: str, node_id: str) -> None:
    request = NodeRequest(task_id=task_id, node_id=node_id, node_type="tool_call",
                          attempt=3, fence=7, config={"tool": "echo", "timeout": 5.0},
                          input=None, labels={"ax-canary": "true"})

    job = build_job(request, settings=JobSettings(), dag_hash="f" * 64)

    check_job(job, timeout=5)
    labels = job["metadata"]["labels"]
    assert labels["ax-fence"] == "7" and labels["ax-attempt"] == "3"
    assert job["metadata"]["annotations"] == {"ax-task-id": task_id, "ax-node-id": node_id}


def test_names_are_stable_per_claim_and_differ_across_fences_and_ids() -> None:
    for task_id in AWKWARD_IDS:
        name = job_name(task_id, "Fetch_Report", 2)
        assert name == job_name(task_id, "Fetch_Report", 2)
        assert name != job_name(task_id, "Fetch_Report", 3)
    # Ids whose readable parts coincide still get different names.
    assert job_name("a-b", "c", 1) != job_name("a", "b_c", 1)
    assert job_name("T1", "n", 1) != job_name("t1", "n", 1)
    assert len(job_name("t", "n", 10**40)) <= 63


def test_label_values_are_kept_when_valid_and_hashed_when_not() -> None:
    assert label_value("t-20240101-abc") == "t-20240101-abc"
    assert label_value("Fetch_Report") == "Fetch_Report"
    long = label_value("x" * 200)
    assert len(long) <= 63 and long.startswith("xxxx") and LABEL_VALUE.match(long)
    assert label_value("x" * 200) != label_value("x" * 201)
    for text in AWKWARD_IDS:
        assert LABEL_VALUE.match(label_value(text)) and len(label_value(text)) <= 63


def test_the_fence_and_the_task_id_are_options(capsys: pytest.CaptureFixture[str]) -> None:
    dag = str(ROOT / "dags" / "financial_risk_assessment.yaml")

    first = k8s_job(capsys, dag, "parse_pdf", "--task-id", "t-42", "--fence", "4")
    again = k8s_job(capsys, dag, "parse_pdf", "--task-id", "t-42", "--fence", "4")
    other = k8s_job(capsys, dag, "parse_pdf", "--task-id", "t-42", "--fence", "5")

    assert first == again
    assert first["metadata"]["name"] == job_name("t-42", "parse_pdf", 4)
    assert other["metadata"]["name"] != first["metadata"]["name"]
    assert first["metadata"]["labels"]["ax-task"] == "t-42"


@pytest.mark.parametrize(("argv", "message"), [
    (["parse_pfd"], "no node 'parse_pfd' (did you mean 'parse_pdf'?)"),
    (["assess_risk"], "node 'assess_risk' is a condition node"),
    (["send_high_risk_email"], "node 'send_high_risk_email' is a human_gateway node"),
    (["parse_pdf", "--input", "{not json"], "--input: the argument is not valid JSON"),
    (["parse_pdf", "--label", "nope"], "--label must look like KEY=VALUE, not 'nope'"),
    (["parse_pdf", "--fence", "0"], "a fence is 1 or more"),
])
def test_what_has_no_job_is_refused_naming_file_and_node(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    dag = "dags/financial_risk_assessment.yaml"

    code = main(["k8s", "job", str(ROOT / dag), *argv])

    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    if "node '" in message:
        assert str(ROOT / dag) in err


def test_an_invalid_dag_prints_its_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dag = tmp_path / "bad.yaml"
    dag.write_text("name: bad\nnodes:\n  a: {type: tool_call, tool: echo, runner: pods}\n")

    assert main(["k8s", "job", str(dag), "a"]) == 2
    assert f"{dag}:3: node 'a': runner must be one of" in capsys.readouterr().err


def test_bad_settings_files_name_the_file_and_every_key(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump({
        "namespce": "ax", "api_address": "no-port", "ttl_seconds_after_finished": -1,
        "resources": {"requests": {"cpu": "1.5.3", "memory": "2Gi"},
                      "limits": {"memory": "1Gi"}},
        "canary": {"selector": "ax-canary=true"}, "images": {"llm": "x"},
    }))

    with pytest.raises(InputError) as info:
        load_job_settings(path)

    lines = str(info.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    text = "\n".join(lines)
    for expected in ("namespce: unknown key (did you mean 'namespace'?)",
                     "api_address: 'no-port' is not host:port",
                     "ttl_seconds_after_finished: -1 is not an integer >= 0",
                     "resources.requests.cpu: '1.5.3' is not a non-negative",
                     "resources.requests.memory: 2Gi is more than resources.limits.memory 1Gi",
                     "canary: needs both", "images.llm: expected llm_call, tool_call"):
        assert expected in text, text


def test_an_empty_or_missing_settings_file(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")

    assert load_job_settings(tmp_path / "empty.yaml") == JobSettings()
    with pytest.raises(InputError, match=r"cannot read job settings .*missing\.yaml"):
        load_job_settings(tmp_path / "missing.yaml")


def test_images_by_tool_then_node_type_then_default() -> None:
    settings = JobSettings(images={"tool_call": "tools:1", "tool:pdf_parser": "pdf:1",
                                   "llm_call": "llm:1"}, default_image="ax:1")

    def image(node_type: str, tool: str | None = None) -> str:
        config = {"tool": tool} if tool else {"model": "gpt-4o"}
        request = NodeRequest(task_id="t", node_id="n", node_type=node_type, attempt=1,
                              fence=1, config=config, input=None)
        return settings.image_for(request)

    assert image("tool_call", "pdf_parser") == "pdf:1"
    assert image("tool_call", "echo") == "tools:1"
    assert image("llm_call") == "llm:1"
    assert JobSettings(default_image="ax:1").image_for(NodeRequest(
        task_id="t", node_id="n", node_type="llm_call", attempt=1, fence=1, config={},
        input=None)) == "ax:1"


def test_the_documented_kind_walkthrough_applies_this_directory() -> None:
    docs = (ROOT / "docs" / "deployment.md").read_text()
    commands = [shlex.split(line.strip().rstrip("\\"))
                for line in docs.splitlines() if line.strip().startswith("kubectl apply")]

    assert ["kubectl", "apply", "-k", "deploy/k8s"] in commands
