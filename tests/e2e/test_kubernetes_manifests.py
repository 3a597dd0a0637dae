"""The Kubernetes manifests of deploy/kubernetes (docs/DEPLOY.md, "Containers"):
kubectl reads every one of them, every worker role the code declares runs in some
Deployment (as in deploy/systemd), each Deployment has a PodDisruptionBudget and
resource requests, the API's probes and preStop fit in the grace period with the
drain, the migration is a Job, settings come from the ConfigMap and the Secret,
and the Secret holds placeholders only.

`kubectl apply --dry-run=client` needs an API server even with --validate=false
(it maps each kind through the server's discovery), so without a cluster kubectl
checks what works offline: `kubectl label --local --dry-run=client` parses every
object; with a cluster reachable, `kubectl apply --dry-run=client` runs as well."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reservo.bootstrap import declared_background_roles, declared_consumers
from reservo.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
USER_ID = 10001


def objects() -> list[dict[str, Any]]:
    found = [
        doc
        for path in sorted(MANIFESTS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    assert found, f"no manifests in {MANIFESTS}"
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(kind) if o["metadata"]["name"] == name]
    return found


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_kubectl_reads_every_manifest() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl missing: Debian's kubernetes-client package has it")
    expected = sorted(f"{o['kind'].lower()}/{o['metadata']['name']}" for o in objects())
    parsed = _kubectl(
        "label", "--local", "--dry-run=client", "-o", "name", "-f", str(MANIFESTS), "checked=yes"
    )
    assert parsed.returncode == 0, parsed.stderr
    assert (
        sorted(
            n.replace(".apps/", "/").replace(".batch/", "/").replace(".policy/", "/")
            for n in parsed.stdout.split()
        )
        == expected
    )
    if _kubectl("version", "--request-timeout=3s").returncode != 0:
        print("no Kubernetes API server reachable: kubectl apply --dry-run=client not run")
        return
    applied = _kubectl("apply", "--dry-run=client", "-f", str(MANIFESTS))
    assert applied.returncode == 0, applied.stderr


def test_every_declared_role_runs_in_some_worker_deployment() -> None:
    running: set[str] = set()
    for deployment in of_kind("Deployment"):
        args = container(deployment)["args"]
        if args[0] == "worker":
            running |= set(args[args.index("--roles") + 1].split(","))
    assert set(declared_background_roles()) | set(declared_consumers()) <= running, running


def test_every_deployment_has_a_budget_requests_and_the_configuration() -> None:
    budgets = {
        tuple(sorted(b["spec"]["selector"]["matchLabels"].items()))
        for b in of_kind("PodDisruptionBudget")
    }
    for obj in [*of_kind("Deployment"), *of_kind("Job")]:
        name = obj["metadata"]["name"]
        pod = obj["spec"]["template"]["spec"]
        main = container(obj)
        assert main["image"].startswith("localhost/reservo:"), name
        assert main["resources"]["requests"]["cpu"] and main["resources"]["requests"]["memory"]
        sources = {next(iter(s.values()))["name"] for s in main["envFrom"]}
        assert sources == {"reservo-config", "reservo-secrets"}, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == USER_ID, name
        if obj["kind"] == "Deployment":
            labels = tuple(sorted(obj["spec"]["selector"]["matchLabels"].items()))
            assert labels in budgets, f"{name} has no PodDisruptionBudget"


def test_the_migration_is_a_job() -> None:
    job = named("Job", "reservo-migrate")
    assert container(job)["args"] == ["db", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_api_probes_and_stop_fit_in_the_grace_period() -> None:
    api = named("Deployment", "reservo-api")
    main = container(api)
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = named("ConfigMap", "reservo-config")["data"]
    Settings.model_validate(  # the ConfigMap's values are settings reservo takes
        {k.removeprefix("RESERVO_").lower(): v for k, v in config.items()}
    )
    drain = float(config["RESERVO_HTTP_DRAIN_S"])
    shutdown = float(config["RESERVO_HTTP_SHUTDOWN_TIMEOUT_S"])
    pre_stop = shlex.split(" ".join(main["lifecycle"]["preStop"]["exec"]["command"]))
    assert pre_stop[0] == "sleep", pre_stop
    grace = api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert float(pre_stop[1]) + drain + shutdown < grace, (pre_stop, drain, shutdown, grace)


def test_the_secret_holds_placeholders_only() -> None:
    secret = named("Secret", "reservo-secrets")["stringData"]
    for name in (
        "RESERVO_JWT_SECRET",
        "RESERVO_PAYMENTS_WEBHOOK_SECRET",
        "RESERVO_RESULTS_WEBHOOK_SECRET",
    ):
        assert secret[name] == "CHANGE-ME", name
    assert "CHANGE-ME" in secret["RESERVO_DATABASE_URL"]
