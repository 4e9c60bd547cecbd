"""An endpoint someone else runs (options["url"]): servelab measures it but never starts or stops it.

Decision: `command` returns a LaunchSpec with an EMPTY argv (`spec.external` is True) that carries the
endpoint's host, port and scheme, so the lifecycle can skip launch and teardown and go straight to the
readiness check, without asking the engine's name. A missing or malformed URL is a ConfigError. Readiness
is "/v1/models lists the model" (no /health assumed); nothing about its configuration is known except what
an info endpoint (/version, /get_server_info) reports.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.options import EngineOptions
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject


def _endpoint(s: Settings) -> tuple[str, str, int]:
    url = s.options.get("url")
    if not url:
        raise ConfigError(
            "an external engine needs options.url",
            hint="e.g. url = 'http://10.0.0.5:8000' (the server's base URL)",
        )
    parts = urlsplit(str(url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"external url {url!r} is not an http(s) URL", hint="e.g. http://10.0.0.5:8000")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"external url {url!r} has an invalid port") from exc
    return parts.scheme, parts.hostname, port


class Options(EngineOptions):
    """An external endpoint's options: where it is."""

    url: str | None = Field(
        default=None, min_length=1, description="the server's base URL, http(s)://host:port"
    )


class External:
    """A running OpenAI-compatible server servelab does not manage."""

    name = "external"
    default_port = 8000
    startup_timeout_s = 60.0
    readiness = Readiness(health_path=None, loading_status=(), check_models=True)
    capabilities = EngineCapabilities(metric_prefix=None, gpu=False, launches=False)
    options_model = Options

    def command(self, s: Settings) -> LaunchSpec:
        scheme, host, port = _endpoint(s)
        return LaunchSpec(argv=[], env={}, host=host, port=port, served_model=s.served_name, scheme=scheme)

    def requested(self, s: Settings) -> JsonObject:
        _endpoint(s)
        return {"model": s.model, "served_model_name": s.served_name}

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        cfg = EffectiveConfig()
        if server_info:
            if server_info.get("version"):
                cfg.set("version", str(server_info["version"]), "info endpoint")
            for raw_key, key in (
                ("model_path", "model"),
                ("tp_size", "tp_size"),
                ("served_model_name", "served_model_name"),
            ):
                if raw_key in server_info:
                    cfg.set(key, server_info[raw_key], "info endpoint")
        return lp.finish(cfg)

    def info_paths(self) -> tuple[str, ...]:
        return ("/version", "/get_server_info")


ENGINE = External()
