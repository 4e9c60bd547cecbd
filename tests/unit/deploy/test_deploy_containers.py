"""Compose and Kubernetes files from a stored run, validated against their vendored JSON schemas."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from servelab.deploy import compose, containers, kubernetes, source, spec
from servelab.errors import ConfigError
from servelab.store.db import Store

SCHEMAS = Path(__file__).resolve().parents[2] / "fixtures" / "schemas"
HOSTILE = 'a b "q" $HOME $(X) %'

MakeStudy = Callable[..., dict[str, Any]]


def _compose_validator() -> jsonschema.protocols.Validator:
    # The file declares draft 2019-09 but is written in draft-07 terms (as docker-compose validated it).
    return jsonschema.Draft7Validator(json.loads((SCHEMAS / "compose-spec.json").read_text()))


def _k8s(kind: str, doc: dict[str, Any]) -> None:
    defs = json.loads((SCHEMAS / "k8s-v1.34-deployment-service.json").read_text())
    schema = {"$schema": defs["$schema"], "$defs": defs["$defs"], "$ref": f"#/$defs/{kind}"}
    jsonschema.Draft202012Validator(schema).validate(doc)


def _dep(store: Store, make_study: MakeStudy, engine: str = "vllm", **kw: Any) -> spec.DeploySpec:
    ids = make_study(engine, env={"ODD": HOSTILE, "CUDA_VISIBLE_DEVICES": "2,3"} if engine != "sim" else {})
    rec = source.apply_overrides(source.resolve(store, ids["uid"]))
    return spec.build(rec, "llm-api", **kw)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sim"])
def test_compose_is_valid_and_carries_the_run(engine: str, store: Store, make_study: MakeStudy) -> None:
    dep = _dep(store, make_study, engine)
    cp = containers.plan(dep, image="img:1" if engine == "sim" else None)
    text = compose.dump(compose.render(dep, cp))
    doc = yaml.safe_load(text)
    _compose_validator().validate(doc)
    svc = doc["services"]["llm-api"]
    assert svc["entrypoint"][0] == "python3" and svc["entrypoint"][1:] == [
        a.replace("$", "$$") for a in dep.argv[1:]
    ]
    assert svc["network_mode"] == "host" and svc["shm_size"] == "16g"
    assert svc["healthcheck"]["start_period"] == f"{dep.start_timeout_s}s"
    if engine == "sim":
        assert "deploy" not in svc
    else:
        assert svc["environment"]["ODD"] == HOSTILE.replace("$", "$$")
        assert svc["image"] == ("vllm/vllm-openai:v0.32.0" if engine == "vllm" else "lmsysorg/sglang:v0.32.0")
        dev = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert dev["device_ids"] == ["2", "3"] and dev["capabilities"] == ["gpu"]


def test_compose_schema_rejects_a_wrong_file() -> None:
    """The validation above can fail."""
    with pytest.raises(jsonschema.ValidationError):
        _compose_validator().validate({"services": {"x": {"image": "i", "shm_sizes": "1g"}}})


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sim"])
def test_kubernetes_is_valid_and_carries_the_run(engine: str, store: Store, make_study: MakeStudy) -> None:
    dep = _dep(store, make_study, engine, env_file="/etc/llm.env")
    cp = containers.plan(dep, image="img:1", shm_size="8g")
    docs = list(yaml.safe_load_all(kubernetes.dump(kubernetes.render(dep, cp, namespace="ml"))))
    deployment, service = docs
    _k8s("Deployment", deployment)
    _k8s("Service", service)
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
    default = {"vllm": 8000, "sglang": 30000, "sim": 8000}[engine]  # the engine's port, not the trial's 8123
    assert c["command"][c["command"].index("--port") + 1] == str(default)
    assert c["ports"][0]["containerPort"] == default
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    health = dep.readiness.health_path or "/v1/models"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": health, "port": "http"}
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= dep.start_timeout_s
    assert c["envFrom"] == [{"secretRef": {"name": "llm-api-env"}}]
    assert pod["terminationGracePeriodSeconds"] == dep.stop_timeout_s
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert service["spec"]["ports"][0]["port"] == default and service["metadata"]["namespace"] == "ml"
    if engine == "sim":
        assert "resources" not in c
    else:
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["ODD"] == HOSTILE.replace("$", "$$")


def test_kubernetes_schema_rejects_a_wrong_deployment() -> None:
    with pytest.raises(jsonschema.ValidationError):
        _k8s("Deployment", {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": "one"}})


def test_image_without_a_published_version_is_unpinned_and_says_how_to_pin(
    store: Store, make_study: MakeStudy
) -> None:
    dep = _dep(store, make_study, "vllm")
    for version, why in (
        (None, "recorded no vllm version"),
        ("0.11.1.dev7+g1234abc", "not a published release"),
    ):
        bare = spec.build(source.LaunchRecord(**{**dep.record.__dict__, "engine_version": version}), "x")
        cp = containers.plan(bare)
        assert cp.image == "vllm/vllm-openai:latest"
        assert any(why in n and "pin it with --image vllm/vllm-openai:vX.Y.Z" in n for n in cp.notes), (
            cp.notes
        )
    with pytest.raises(ConfigError, match="'sim' has no published container image"):
        containers.plan(_dep(store, make_study, "sim"))


def test_published_images_are_the_engines_own_at_the_measured_version() -> None:
    assert containers.published_image("vllm", "0.11.0")[0] == "vllm/vllm-openai:v0.11.0"
    assert containers.published_image("sglang", "0.5.5.post1")[0] == "lmsysorg/sglang:v0.5.5.post1"
    assert (
        containers.published_image("llamacpp", "b6123 (abc1234)")[0]
        == "ghcr.io/ggml-org/llama.cpp:server-cuda-b6123"
    )
    assert containers.published_image("sglang", None)[0] == "lmsysorg/sglang:latest"


def test_quantity() -> None:
    assert kubernetes.quantity("16g") == "16Gi" and kubernetes.quantity("512m") == "512Mi"
