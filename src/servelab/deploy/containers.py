"""What Compose and Kubernetes share: the run's command line inside an image, its mounts and probes.

Inside a container the host's interpreter path means nothing, so argv[0] becomes the image's (`python3` for
a Python interpreter, else its basename); every other word stays the run's. A local model directory is
mounted at the same path, read-only, so `--model PATH` keeps working unchanged."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import yaml

from servelab.deploy.spec import DeploySpec, defaults
from servelab.errors import ConfigError


@dataclass(frozen=True)
class ContainerPlan:
    image: str
    argv: list[str]
    model_mount: str | None  # host path mounted at the same path (read-only)
    shm_size: str
    health_path: str
    notes: list[str]


def published_image(engine: str, version: str | None) -> tuple[str, str]:
    """(image, note): the engine's published image (defaults.toml [container.images.ENGINE]) at the version
    the trial recorded when that version is a published release, else its unpinned tag, with how to pin it."""
    entry = defaults().container.images.get(engine)
    if entry is None:
        raise ConfigError(
            f"{engine!r} has no published container image",
            hint="pass --image IMAGE (for the simulator: an image with servelab installed)"
            if engine == "sim"
            else "pass --image IMAGE",
        )
    repo = entry.repository
    v = (version or "").strip().removeprefix("v")
    if engine == "llamacpp":  # llama.cpp reports `b6000 (abc123)`: the build number is the tag
        m = re.match(r"b\d+", v)
        v = m.group(0) if m else ""
    if v and re.fullmatch(entry.published, v):
        image = f"{repo}:{entry.tag.format(version=v)}"
        return image, f"image {image}: the {engine} version the study's trial measured ({version})"
    image = f"{repo}:{entry.unpinned}"
    why = (
        f"the trial recorded {engine} {version}, which is not a published release"
        if version
        else f"the trial recorded no {engine} version"
    )
    pin = entry.tag.format(version="X.Y.Z" if engine != "llamacpp" else "bNNNN")
    return image, f"image {image} is not pinned ({why}): pin it with --image {repo}:{pin}"


def plan(spec: DeploySpec, image: str | None = None, shm_size: str | None = None) -> ContainerPlan:
    rec, notes = spec.record, list(spec.notes)
    if image is None:
        image, note = published_image(rec.engine, rec.engine_version)
        notes.append(note)
    exe = os.path.basename(spec.argv[0])
    inner = "python3" if exe.startswith("python") else exe
    if inner != spec.argv[0]:
        notes.append(f"{spec.argv[0]} runs as {inner} inside the image")
    model = rec.model_path if rec.model_path.startswith("/") else None
    if model is None:
        notes.append(
            f"model {rec.model_path!r} is not a local path: the container fetches it (mount a Hugging Face "
            "cache, or deploy a run that loaded a local directory)"
        )
    return ContainerPlan(
        image=image,
        argv=[inner, *spec.argv[1:]],
        model_mount=model,
        shm_size=shm_size or defaults().container.shm_size,
        health_path=spec.readiness.health_path or "/v1/models",
        notes=notes,
    )


def dollar_escape(value: str) -> str:
    """Compose interpolates `$VAR` and Kubernetes expands `$(VAR)`; both read `$$` as one literal `$`."""
    return value.replace("$", "$$")


class _Dumper(yaml.SafeDumper):
    """No `&id001` anchors: a file people read and edit spells every value out."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(docs: list[Any]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=10_000)
