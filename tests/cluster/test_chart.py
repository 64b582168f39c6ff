"""The Helm chart, checked by the real helm, installed on the KWOK cluster; its RBAC proven
sufficient (the operator runs the TrainingJob and InferencePool scenarios with the chart's
ServiceAccount token) and not too wide (that identity cannot read Secrets); every dashboard
panel's query run against a real Prometheus scraping that operator."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tidal.dashboard import queries
from tidal.k8s.api import Api, load_client
from tidal.k8s.disruption_ledger import CONFIGMAP_SUFFIX, DATA_KEY
from tidal.k8s.watch import TABLES

from .kube import REPO, Kube, eventually, token_kubeconfig
from .operator_process import OperatorProcess, free_port
from .test_operator import job, pods_of, submit, wait_phase
from .test_tide import pool, pool_status

CHART = REPO / "charts" / "tidal"
RELEASE, NAMESPACE = "tidal-rel", "tidal-system"
SERVICE_ACCOUNT = "tidal-rel"


def helm(kube: Kube, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(kube.bin / "helm"), *args], capture_output=True, text=True, env=kube.env())
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stdout}{result.stderr}")
    return result


def test_helm_lint_and_template(kube: Kube):
    assert "0 chart(s) failed" in helm(kube, "lint", str(CHART), "--strict").stdout
    rendered = helm(
        kube,
        "template",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ClusterKopfPeering",
            "Deployment",
            "Service",
            "ServiceMonitor",
            "PrometheusRule",
            "ConfigMap",
        ]
    )
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 2 and "--priority=auto" in container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" and container["readinessProbe"]
    assert f"--state-namespace={NAMESPACE}" in container["args"], "the disruption ledger is in the release's namespace"
    # The operator's peering identity comes from POD_NAME, only in the container's own process
    # (runner.peering_id): POD_ID set here would be inherited by a `kubectl exec`'d second operator.
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and "POD_ID" not in env
    rule = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PrometheusRule")
    promtool_tested = yaml.safe_load((CHART / "files" / "tidal-alerts.yaml").read_text())
    assert rule["spec"] == promtool_tested, "the PrometheusRule carries the promtool-tested rules"
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.logLevel=LOUD", check=False)
    assert bad.returncode != 0 and "logLevel" in bad.stderr
    # Load sources: named by the admin, passed as flags; a pool can only name one.
    sources = "operator.loadSources.main=http://prometheus.monitoring.svc:9090"
    rendered = helm(kube, "template", RELEASE, str(CHART), "--set", sources).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--load-source=main=http://prometheus.monitoring.svc:9090" in args
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.loadSources.main=ftp://x", check=False)
    assert bad.returncode != 0 and "/operator/loadSources/main" in bad.stderr
    # (helm 4 names the wrong path for a bad property name, hence only the name is checked)
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.loadSources.Bad_Name=http://x", check=False)
    assert bad.returncode != 0 and "'Bad_Name' does not match pattern" in bad.stderr
    # The API request timeout: a flag, 15 s unless set; a timeout of 0 would fail every call.
    assert "--api-timeout=15" in args
    rendered = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.apiTimeoutSeconds=30").stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert "--api-timeout=30" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.apiTimeoutSeconds=0", check=False)
    assert bad.returncode != 0 and "apiTimeoutSeconds" in bad.stderr
    # The tide's hysteresis: the operator's defaults unless set (a slow load wave wants longer).
    assert "--scale-down-stabilization=300" in args and "--grow-back-cooldown=600" in args
    assert "--not-ready-grace=30" in args and "--packing=keep-whole" in args
    slow = ["--set", "operator.scaleDownStabilizationSeconds=1800", "--set", "operator.growBackCooldownSeconds=3600"]
    rendered = helm(kube, "template", RELEASE, str(CHART), *slow).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scale-down-stabilization=1800" in args and "--grow-back-cooldown=3600" in args
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.growBackCooldownSeconds=0", check=False)
    assert bad.returncode != 0 and "growBackCooldownSeconds" in bad.stderr
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.packing=tightest", check=False)
    assert bad.returncode != 0 and "packing" in bad.stderr
    # The "cycle done" summary's cadence: the operator's default unless set; never negative.
    assert "--cycle-log-seconds=30" in args
    bad = helm(kube, "template", RELEASE, str(CHART), "--set", "operator.cycleLogSeconds=-1", check=False)
    assert bad.returncode != 0 and "cycleLogSeconds" in bad.stderr


def sa_kubeconfig(kube: Kube, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount, with a real token."""
    return token_kubeconfig(kube, SERVICE_ACCOUNT, NAMESPACE, path)


@pytest.fixture
def installed_chart(kube: Kube):
    helm(
        kube,
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        "image.tag=test",
        "--wait=false",
    )
    yield
    helm(kube, "uninstall", RELEASE, "-n", NAMESPACE, check=False)


def start_prometheus(tmp: Path, target_port: int) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("prometheus")
    assert exe, "prometheus not found: e2e/setup.sh installs it (Debian package prometheus)"
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "tidal", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
                ],
            }
        )
    )
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(tmp / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, port


def promql(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:  # a query that does not parse answers 400 with the reason
        return json.load(e)


def test_install_rbac_and_dashboard_queries(
    kube: Kube, operator: OperatorProcess, installed_chart, namespace: str, tmp_path: Path
):
    # The release's objects exist.
    assert kube.get("deployment", RELEASE, "-n", NAMESPACE)["spec"]["replicas"] == 2
    for kind, name in (
        ("serviceaccount", SERVICE_ACCOUNT),
        ("service", f"{RELEASE}-metrics"),
        ("configmap", f"{RELEASE}-dashboard"),
    ):
        kube.get(kind, name, "-n", NAMESPACE)
    kube.get("clusterrole", RELEASE)
    kube.get("clusterkopfpeering", RELEASE)
    dashboard = kube.get("configmap", f"{RELEASE}-dashboard", "-n", NAMESPACE)
    assert json.loads(dashboard["data"]["tidal.json"])["uid"] == "tidal"

    # Not too wide: the operator's identity cannot read Secrets.
    kubeconfig = sa_kubeconfig(kube, tmp_path / "sa.kubeconfig")
    as_sa = Kube(kubeconfig, kube.bin)
    denied = as_sa.run("get", "secrets", "-A", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    assert as_sa.run("auth", "can-i", "get", "secrets", "-n", "kube-system", check=False).stdout.strip() == "no"
    assert as_sa.run("auth", "can-i", "create", "pods", "-n", namespace).stdout.strip() == "yes"
    # ComputeDomains (GB200 NVL72): made and pruned, nothing more (the CRD's presence is discovery).
    # Asked as a SelfSubjectAccessReview: `kubectl auth can-i` answers "no" for a resource type
    # the API server does not serve, and the driver's CRD is not installed here.
    for verb, allowed in (("create", True), ("delete", True), ("get", True), ("update", False)):
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "group": "resource.nvidia.com",
                    "resource": "computedomains",
                    "verb": verb,
                    "namespace": namespace,
                }
            },
        }
        answer = json.loads(as_sa.run("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout)
        assert answer["status"].get("allowed", False) is allowed, (verb, answer["status"])

    # The index audit's LIST of every watched kind is allowed to that identity.
    sa_api = Api(load_client(str(kubeconfig)), workers=1)
    # The disruption ledger's ConfigMap, and no other, is read and written in the release's namespace.
    assert as_sa.run("auth", "can-i", "get", "configmaps", "-n", NAMESPACE, check=False).stdout.strip() == "no"
    ledger = RELEASE + CONFIGMAP_SUFFIX  # named after the release's peering name
    assert sa_api.read_config_map(NAMESPACE, ledger) == (None, None)
    sa_api.save_config_map(NAMESPACE, ledger, {DATA_KEY: "[]"}, None)  # made
    with pytest.raises(ApiException) as made_twice:
        sa_api.save_config_map(NAMESPACE, ledger, {DATA_KEY: "[]"}, None)
    assert made_twice.value.status == 409
    _, version = sa_api.read_config_map(NAMESPACE, ledger)
    row = {"job": "uid-1", "at": "2026-05-01T12:00:00Z", "gpus": 8}
    sa_api.save_config_map(NAMESPACE, ledger, {DATA_KEY: json.dumps([row])}, version)  # patched at that version
    data, newer = sa_api.read_config_map(NAMESPACE, ledger)
    assert json.loads(data[DATA_KEY])[0]["gpus"] == 8 and newer != version
    with pytest.raises(ApiException) as stale:  # a replica that read before that write overwrites nothing
        sa_api.save_config_map(NAMESPACE, ledger, {DATA_KEY: "[]"}, version)
    assert stale.value.status == 409
    assert json.loads(sa_api.read_config_map(NAMESPACE, ledger)[0][DATA_KEY])[0]["gpus"] == 8
    kube.delete("configmap", ledger, "-n", NAMESPACE)
    listed = {kind: sa_api.list_keys(kind) for kind in TABLES}  # a 403 would raise
    assert listed["node"] and listed["supernode"] and listed["priorityclass"]
    # Sufficient: with only that identity, the operator runs both scenarios.
    operator.stop()  # one acting operator at a time
    metrics_port = free_port()
    sa_operator = OperatorProcess(
        kubeconfig,
        tmp_path,
        "--peering-name",
        RELEASE,
        "--metrics-port",
        str(metrics_port),
        "--discover-supernodes",
        "tidal.dev/supernode",
        "--state-namespace",
        NAMESPACE,
    )
    sa_operator.start()
    prometheus, prom_port = start_prometheus(tmp_path, metrics_port)
    try:
        serving = {
            "spec": {
                "containers": [
                    {"name": "server", "image": "server:latest", "ports": [{"name": "http", "containerPort": 8000}]}
                ]
            }
        }
        submit(
            kube,
            namespace,
            job("rbac-train", tp=4, ep=4, pp=2, dp=2),
            pool("rbac-pool", minReplicas=2, maxReplicas=2, template=serving),
        )
        wait_phase(kube, namespace, "rbac-train", "Running", timeout=120)
        eventually(
            lambda: pool_status(kube, namespace, "rbac-pool").get("readyReplicas") == 2,
            timeout=90,
            what="pool ready under the chart's RBAC",
        )
        assert len(pods_of(kube, namespace, "rbac-train")) == 16

        # The pool's Service is created, then updated (its port follows the template): both allowed.
        def service_port():
            return kube.get("service", "rbac-pool", "-n", namespace)["spec"]["ports"][0]["port"]

        eventually(lambda: service_port() == 8000, timeout=30, what="the pool's Service under the chart's RBAC")
        serving["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
        patch = json.dumps({"spec": {"template": serving}})
        kube.run("patch", "-n", namespace, "inferencepools.tidal.dev", "rbac-pool", "--type=merge", "-p", patch)
        eventually(lambda: service_port() == 8080, timeout=30, what="the Service updated under the chart's RBAC")
        events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=rbac-train")["items"]
        assert any(e["reason"] == "Admitted" for e in events), "events are allowed"
        assert "Forbidden" not in sa_operator.logs() and "forbidden" not in sa_operator.logs()
        assert "disruption ledger not read or saved" not in sa_operator.logs()

        # Every dashboard query parses and returns data from a real Prometheus.
        eventually(
            lambda: promql(prom_port, "tidal_cycles_total")["data"]["result"],
            timeout=60,
            what="Prometheus scraping the operator",
        )
        time.sleep(3)  # a few more scrapes, so rate() and increase() have two samples
        for expr in queries():
            answer = promql(prom_port, expr)
            assert answer["status"] == "success", f"{expr}: {answer}"
            assert answer["data"]["result"], f"no data for {expr}"
    finally:
        prometheus.terminate()
        prometheus.wait(20)
        # Delete while this operator still runs: it removes its finalizers.
        kube.delete("trainingjob", "rbac-train", "-n", namespace)
        kube.delete("inferencepool", "rbac-pool", "-n", namespace)
        eventually(
            lambda: (
                not kube.get("trainingjobs", "-n", namespace)["items"]
                and not kube.get("inferencepools", "-n", namespace)["items"]
            ),
            timeout=60,
            what="cleanup",
        )
        sa_operator.stop()
        operator.start()
