"""The Engine protocol: what servelab must know about an inference engine to launch, verify and diagnose it.

One adapter per engine (vllm, sglang, transformers, llamacpp, sim, external) implements this protocol and
registers itself in `servelab.engines.registry`. Everything engine-specific lives in its adapter; the
lifecycle, the study loop and `servelab logs` only speak this protocol. Adapters are pure (no I/O), except
where a method is documented to take text or data that the caller fetched. An adapter also declares the
`[engine.options]` it reads as `options_model` (see `servelab.engines.options`); it is not part of the
protocol so that an outside adapter without one still registers (its options are then passed as given).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from servelab.jsontypes import JsonObject, JsonValue

# The normalized keys of an effective (or requested) configuration. Adapters map their engine's own
# spellings onto these; keys an engine does not expose are simply absent.
NORMALIZED_KEYS: tuple[str, ...] = (
    "model",
    "served_model_name",
    "tp_size",
    "pp_size",
    "ep_size",
    "dp_size",
    "enable_dp_attention",
    "moe_runner_backend",
    "attention_backend",
    "quantization",
    "kv_cache_dtype",
    "max_running_requests",
    "max_num_batched_tokens",
    "max_model_len",
    "mem_fraction",
    "disable_radix_cache",  # SGLang radix cache / vLLM prefix caching, expressed as "disabled"
    "cuda_graph",  # True when CUDA graphs are captured (vLLM: not enforce_eager; SGLang: not disable_cuda_graph)
    "enable_allreduce_fusion",
    "dtype",
    "port",
    "kv_cache_tokens",
    "version",
)


@dataclass(frozen=True)
class Settings:
    """A candidate's typed common settings plus pass-through engine flags and environment.

    `extra_args` are engine flags spelled exactly as the engine spells them (["--moe-runner-backend",
    "flashinfer_trtllm"]); `env` adds environment variables (NCCL_*, VLLM_*, CUDA_VISIBLE_DEVICES);
    `options` carries adapter-specific knobs (the python executable, the simulator's gpu/num_gpus/speed/
    faults, an external endpoint's URL): the study's table, checked against the adapter's `options_model`,
    so a reader narrows the value it takes.
    """

    model: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: the lifecycle picks a free port before launch
    tp: int = 1
    pp: int = 1
    ep: int | None = None
    dp: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_concurrency: int | None = None
    mem_fraction: float | None = None
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        """The name clients ask for (and /v1/models must list): the served name, else the model path."""
        return self.served_model_name or self.model

    def text_option(self, key: str) -> str | None:
        """An option that is text (the simulator's personality); None when absent or not text."""
        value = self.options.get(key)
        return value if isinstance(value, str) else None

    @property
    def cpus(self) -> list[int] | None:
        """The CPU cores the server is pinned to (options.cpus, a list of ints once the options model
        checked it); None when not pinned."""
        value = self.options.get("cpus")
        return [int(c) for c in value if isinstance(c, int)] if isinstance(value, list) and value else None


@dataclass(frozen=True)
class LaunchSpec:
    """How to start a server: the exact argv and environment additions, and where it will listen."""

    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    served_model: str  # the name /v1/models must list once the server is up
    cwd: str | None = None

    scheme: str = "http"  # "https" for an external endpoint behind TLS

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def external(self) -> bool:
        """Nothing to start or stop: the server runs elsewhere (engine `external` returns an empty argv)."""
        return not self.argv


@dataclass(frozen=True)
class Readiness:
    """An engine's readiness rule, declared as data and carried out by `servelab.lifecycle`.

    - `health_path`: polled until it answers one of `ready_status` (None: no health endpoint).
    - `loading_status`: statuses that mean "alive, still loading" (SGLang before warm-up, llama.cpp 503).
    - `port_opens_when_ready`: the engine only accepts connections once ready (vLLM), so a refused
      connection is "still starting", not a failure.
    - `warmup_request`: /health says ok too early (transformers serve), so readiness also needs one
      real completion of `warmup_api` to succeed.
    - `check_models`: after ready, /v1/models must list the expected model.
    """

    health_path: str | None = "/health"
    ready_status: tuple[int, ...] = (200,)
    loading_status: tuple[int, ...] = (503,)
    port_opens_when_ready: bool = False
    warmup_request: bool = False
    warmup_api: Literal["completions", "chat"] = "completions"
    check_models: bool = True


@dataclass(frozen=True)
class EngineCapabilities:
    """What requests the engine accepts and how it exposes metrics; declared, never `if engine == ...`."""

    ignore_eos: bool = True
    min_tokens: bool = True
    stream_usage: bool = True
    metrics_path: str | None = "/metrics"
    metric_prefix: str | None = None  # "vllm:" / "sglang:"
    reuses_port: bool = False  # sets SO_REUSEPORT: a second server on a busy port can silently share it
    gpu: bool = True  # needs GPUs (False: vLLM-CPU, transformers on CPU, the simulator)
    launches: bool = True  # False: servelab does not start it (an external endpoint); argv is empty
    telemetry_path: str | None = None  # an HTTP route serving GPU telemetry (the simulator's /servelab/gpus)
    verify_reference: str | None = None  # what `verify-output` compares with by default ("sim": its own text)


@dataclass
class EffectiveConfig:
    """What the engine actually runs with, each key tied to the log line or endpoint that showed it. The
    values are JSON: they are compared key by key with `requested` and stored or printed as they are."""

    effective: JsonObject = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)

    def set(self, key: str, value: JsonValue, evidence: str) -> None:
        self.effective[key] = value
        self.evidence[key] = evidence

    def merge(self, other: EffectiveConfig, keep_confirmed: bool = False) -> None:
        """Later sources win (a backend-selection line overrides the args it was chosen from). With
        `keep_confirmed` (an info endpoint), a value it only confirms keeps the earlier evidence: the log
        line that chose a backend says more than an endpoint repeating it, and an endpoint's None (an
        argument left to the engine's choice) never erases the value a log line says it chose."""
        for key, value in other.effective.items():
            if (
                keep_confirmed
                and key in self.effective
                and (self.effective[key] == value or (value is None and self.effective[key] is not None))
                and self.evidence.get(key)
            ):
                continue
            self.effective[key] = value
            self.evidence[key] = other.evidence.get(key, "")

    def to_dict(self) -> JsonObject:
        return {"effective": dict(self.effective), "evidence": dict(self.evidence)}


SettingValue = int | float | bool | str


@dataclass(frozen=True)
class Setting:
    """The server setting that most likely caused a failure and a value to try, from the log's own figures.

    `tried`: the value the failed server ran with, when the log says (a search rules out the values on its
    side of `value`: a max_model_len of `tried` or more when `value` is smaller). `flags`: the engine flags,
    as a study's search space names them, that give `value` (`cuda_graph` false: vLLM `enforce_eager`,
    SGLang `disable_cuda_graph`); empty when the setting is a candidate field of its own name."""

    name: str  # as `logs parse` names it: max_model_len, mem_fraction, cuda_graph
    value: SettingValue  # the value to try
    reason: str  # the figures it comes from
    tried: SettingValue | None = None
    flags: tuple[tuple[str, SettingValue], ...] = ()

    def to_dict(self) -> JsonObject:
        d: JsonObject = {
            "name": self.name,
            "value": self.value,
            "reason": self.reason,
        }
        if self.tried is not None:
            d["tried"] = self.tried
        if self.flags:
            d["flags"] = dict(self.flags)
        return d


@dataclass(frozen=True)
class Diagnosis:
    """A failure class from the signature knowledge base, with the line that matched and what to do."""

    klass: str
    evidence: str
    advice: str
    tail: tuple[str, ...] = ()  # the last lines that matter, when nothing matched (klass == "unknown")
    fatal: bool = False  # the server that printed it will not become ready (or serve again)
    setting: Setting | None = None  # the setting to change, when the log's figures say

    def to_dict(self) -> JsonObject:
        d: JsonObject = {
            "class": self.klass,
            "evidence": self.evidence,
            "advice": self.advice,
            "fatal": self.fatal,
        }
        if self.tail:
            d["tail"] = list(self.tail)
        if self.setting is not None:
            d["setting"] = self.setting.to_dict()
        return d


@runtime_checkable
class Engine(Protocol):
    """One inference engine. Implementations are small, stateless objects registered by name."""

    name: str
    default_port: int
    startup_timeout_s: float  # default start-up budget; large models need many minutes
    readiness: Readiness
    capabilities: EngineCapabilities

    def command(self, s: Settings) -> LaunchSpec:
        """Turn a candidate's settings into argv + environment. Raises ConfigError on impossible input."""
        ...

    def requested(self, s: Settings) -> JsonObject:
        """The normalized configuration the settings ask for (typed settings plus recognised engine flags),
        so it can be compared key by key with `effective_config`."""
        ...

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        """Read the effective configuration from the server's log (and an info endpoint's JSON if fetched)."""
        ...

    def info_paths(self) -> tuple[str, ...]:
        """Endpoints whose JSON `effective_config` can use (SGLang /get_server_info, vLLM /version)."""
        ...
