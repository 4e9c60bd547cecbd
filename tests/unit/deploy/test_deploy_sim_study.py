"""`servelab deploy` of a real study `servelab tune` ran against the simulator (SGLang personality, served
as `glm-5`): the unit serves on the engine's default port, not the trial's random one; its readiness check
asks for the name it serves, also after `--arg --served-model-name=X`; containers get an image that exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from tests.integration.test_tune_sim import servelab
from tests.support.sim_study import SERVED, SimStudy
from tests.unit.deploy.systemd_reader import unquote_words

from servelab.deploy import containers
from servelab.deploy.source import flag_value


def _deploy(s: SimStudy, out: Path, *args: str, check: bool = True) -> Any:
    res = servelab("deploy", s.uid, "--out", str(out), "--json", *args, home=s.home, check=check)
    return json.loads(res.stdout) if check else res


def _words(unit: str, key: str) -> list[str]:
    (v,) = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(key + "=")]
    return unquote_words(v, dollar=True)


def test_unit_serves_on_the_engines_port_and_waits_for_its_served_name(
    sim_study: SimStudy, tmp_path: Path
) -> None:
    trial_url = json.loads(servelab("runs", "study", sim_study.uid, "--json", home=sim_study.home).stdout)
    out = _deploy(sim_study, tmp_path / "a")
    unit = Path(out["file"]).read_text()
    start, post = _words(unit, "ExecStart"), _words(unit, "ExecStartPost")
    assert flag_value(start, "--port") == "30000"  # SGLang's default: the simulator imitates SGLang here
    assert out["url"] == "http://127.0.0.1:30000" and "http://127.0.0.1:30000" in post
    assert post[post.index("--model") + 1] == SERVED == flag_value(start, "--served-model-name")
    assert out["verify"]["ok"] is True, out["verify"]  # systemd-analyze verify
    assert any("not the trial's" in n for n in out["notes"]), out["notes"]
    assert "30000" not in json.dumps(trial_url["candidates"][0]["trials"][0].get("url") or "")

    renamed = _deploy(sim_study, tmp_path / "b", "--arg", "--served-model-name=glm5-prod", "--port", "9123")
    unit = Path(renamed["file"]).read_text()
    start, post = _words(unit, "ExecStart"), _words(unit, "ExecStartPost")
    assert flag_value(start, "--served-model-name") == "glm5-prod" and flag_value(start, "--port") == "9123"
    assert post[post.index("--model") + 1] == "glm5-prod" and "http://127.0.0.1:9123" in post
    assert "Description=servelab sim serving glm5-prod" in unit


def test_containers_get_the_port_the_served_name_and_an_image_that_exists(
    sim_study: SimStudy, tmp_path: Path
) -> None:
    # the simulator has no published image: deploy says so and how to give one
    res = _deploy(sim_study, tmp_path / "c", "--target", "compose", check=False)
    assert res.returncode != 0 and "no published container image" in res.stderr + res.stdout
    assert "--image" in res.stderr + res.stdout
    out = _deploy(sim_study, tmp_path / "c", "--target", "compose", "--image", "servelab-sim:test")
    svc = next(iter(yaml.safe_load(Path(out["file"]).read_text())["services"].values()))
    assert svc["image"] == "servelab-sim:test" and flag_value(svc["entrypoint"], "--port") == "30000"
    assert flag_value(svc["entrypoint"], "--served-model-name") == SERVED
    k8s = _deploy(
        sim_study,
        tmp_path / "k",
        "--target",
        "kubernetes",
        "--image",
        "servelab-sim:test",
        "--arg",
        "--served-model-name=glm5-prod",
    )
    dep, service = yaml.safe_load_all(Path(k8s["file"]).read_text())
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert flag_value(c["command"], "--port") == "30000" and c["ports"][0]["containerPort"] == 30000
    assert service["spec"]["ports"][0]["port"] == 30000
    assert flag_value(c["command"], "--served-model-name") == "glm5-prod"
    # the version the trial recorded (the SGLang the simulator imitates) names the engine's published image
    version = out["source"]["engine_version"]
    assert version and containers.published_image("sglang", version)[0] == f"lmsysorg/sglang:v{version}"
