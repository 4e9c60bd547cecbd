"""A Kubernetes Deployment + Service from a deployment: the run's command line and environment, GPU limits,
a memory-backed /dev/shm, and startup/readiness/liveness probes on the engine's health endpoint.

The pod is reached on its own IP, so `--host` becomes 0.0.0.0 (the one change to the run's command line)."""

from __future__ import annotations

import math
import re

from servelab.deploy.containers import ContainerPlan, dollar_escape, dump_yaml
from servelab.deploy.source import flag_value, set_flag
from servelab.deploy.spec import DeploySpec
from servelab.jsontypes import JsonObject, JsonValue

PERIOD_S = 10


def quantity(size: str) -> str:
    """Docker's `16g` as a Kubernetes quantity (`16Gi`)."""
    m = re.fullmatch(r"(\d+)([kmgt]?)b?", size.strip().lower())
    if not m:
        return size
    return m.group(1) + {"": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[m.group(2)]


def render(spec: DeploySpec, cp: ContainerPlan, namespace: str | None = None) -> list[JsonObject]:
    labels: JsonObject = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "servelab"}
    argv = cp.argv
    if flag_value(argv, "--host") not in (None, "0.0.0.0"):
        argv = set_flag(argv, "--host", "0.0.0.0")
    meta: JsonObject = {
        "name": spec.name,
        "labels": labels,
        "annotations": {
            "servelab/study": spec.record.study_uid,
            "servelab/candidate": spec.record.candidate,
            "servelab/trial": str(spec.record.trial_id),
        },
    }
    if namespace:
        meta["namespace"] = namespace
    http: JsonObject = {"path": cp.health_path, "port": "http"}
    mounts: list[JsonValue] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    container: JsonObject = {
        "name": "server",
        "image": cp.image,
        "command": [dollar_escape(a) for a in argv],
        "env": [{"name": k, "value": dollar_escape(v)} for k, v in sorted(spec.env.items())],
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "volumeMounts": mounts,
        # Start-up may take the whole measured budget; liveness only counts once this has passed.
        "startupProbe": {
            "httpGet": http,
            "periodSeconds": PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": max(1, math.ceil(spec.start_timeout_s / PERIOD_S)),
        },
        "readinessProbe": {
            "httpGet": http,
            "periodSeconds": PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": http,
            "periodSeconds": PERIOD_S * 3,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
    }
    volumes: list[JsonValue] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(cp.shm_size)}}
    ]
    if spec.env_file:
        container["envFrom"] = [{"secretRef": {"name": f"{spec.name}-env"}}]
    if spec.gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": max(1, spec.gpu_count)}}
    if cp.model_mount:
        mounts.append({"name": "model", "mountPath": cp.model_mount, "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": cp.model_mount, "type": "Directory"}})
    deployment: JsonObject = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # the old pod must free its GPUs before the new one starts
            "selector": {"matchLabels": {"app.kubernetes.io/name": spec.name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": spec.stop_timeout_s,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service: JsonObject = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {k: v for k, v in meta.items() if k != "annotations"},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app.kubernetes.io/name": spec.name},
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [deployment, service]


def dump(docs: list[JsonObject]) -> str:
    return dump_yaml(docs)
