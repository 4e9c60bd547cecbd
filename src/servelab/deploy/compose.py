"""A Docker Compose service from a deployment: the run's command line and environment, the GPUs, /dev/shm,
a health check on the engine's endpoint. Host networking keeps the run's `--host 127.0.0.1 --port N` as is."""

from __future__ import annotations

from servelab.deploy.containers import ContainerPlan, dollar_escape, dump_yaml
from servelab.deploy.spec import DeploySpec
from servelab.jsontypes import JsonObject, JsonValue


def render(spec: DeploySpec, cp: ContainerPlan) -> JsonObject:
    url = f"{spec.local_url}{cp.health_path}"
    test: list[JsonValue]
    if cp.argv[0] == "python3":
        test = ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]
    else:
        test = ["CMD", "curl", "-fsS", "-o", "/dev/null", url]
    svc: JsonObject = {
        "image": cp.image,
        "entrypoint": [dollar_escape(a) for a in cp.argv],
        "environment": {k: dollar_escape(v) for k, v in sorted(spec.env.items())},
        "network_mode": "host",
        "shm_size": cp.shm_size,
        "restart": "on-failure",
        "stop_grace_period": f"{spec.stop_timeout_s}s",
        "healthcheck": {
            "test": test,
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": f"{spec.start_timeout_s}s",
        },
        "labels": {
            "servelab.study": spec.record.study_uid,
            "servelab.candidate": spec.record.candidate,
            "servelab.trial": str(spec.record.trial_id),
        },
    }
    if spec.env_file:
        svc["env_file"] = [spec.env_file]
    if spec.user:
        svc["user"] = spec.user
    if cp.model_mount:
        svc["volumes"] = [
            {"type": "bind", "source": cp.model_mount, "target": cp.model_mount, "read_only": True}
        ]
    if spec.gpu:
        dev: JsonObject = {"driver": "nvidia", "capabilities": ["gpu"]}
        if spec.gpu_ids:
            dev["device_ids"] = list(spec.gpu_ids)
        else:
            dev["count"] = spec.gpu_count
        svc["deploy"] = {"resources": {"reservations": {"devices": [dev]}}}
    return {"services": {spec.name: svc}}


def dump(doc: JsonObject) -> str:
    return dump_yaml([doc])
