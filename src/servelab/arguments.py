"""Each option a CLI command and its MCP tool share, declared once: its name, its type and one text.

A declaration is an `Annotated` alias: the tool's parameter type (what MCP's schema shows), a pydantic
`Field` with the text (the tool's description, and the CLI's `--help`), and an `Opt` naming it (the
tool's parameter and the CLI's `--flag`, plus how the CLI spells a list). The MCP tool annotates its
parameter with the alias; the CLI makes its click option from the same alias (`cli.args.option`), so the
two can no longer drift apart (they had: `--slo`'s syntax read differently in the tool). tests/unit/mcp
checks that every tool parameter is one of these or is marked as the tool's own.

Pure vocabulary: imports nothing of ours, so every front may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import Field
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Opt:
    """How an option is named: `name` is the tool's parameter and, dashed, the CLI's `--flag`."""

    name: str
    short: str | None = None  # the CLI's one-letter alias (`-m`)
    # how the CLI spells the tool's list: the option repeated, or one comma-separated value
    cli_list: Literal["repeat", "comma"] | None = None
    argument: bool = False  # the CLI takes it as a positional argument
    # False: the tools' own (a study the tool looks up in the store before it runs the command)
    cli: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Declared:
    """An alias read back: its `Opt`, its text and the Python type the tool takes (None stripped)."""

    opt: Opt
    help: str
    type: Any


def declared(alias: Any) -> Declared | None:
    """The declaration an annotation carries (None: a parameter declared where it is used)."""
    if get_origin(alias) is not Annotated:
        return None
    base, *meta = get_args(alias)
    opt = next((m for m in meta if isinstance(m, Opt)), None)
    info = next((m for m in meta if isinstance(m, FieldInfo)), None)
    if opt is None or info is None:
        return None
    inner = [a for a in get_args(base) if a is not type(None)] if get_args(base) else [base]
    if get_origin(base) is list:
        inner = [base]
    return Declared(opt, info.description or "", inner[0] if len(inner) == 1 else base)


# -- the setup of a prediction (predict, predict --sweep, predict --compare-layouts, explain) ----------

SetupModel = Annotated[
    str | None,
    Field(
        description="Catalog name (GLM-5-NVFP4, ...) or path to config.json (predict: required unless --study; "
        "explain: the run's by default)."
    ),
    Opt("model", "-m"),
]
Gpu = Annotated[
    str | None,
    Field(
        description="GPU kind from the catalog (rtx-pro-6000, h200-sxm, ...; predict: required unless --study; "
        "explain: the run's `host.gpu` by default)."
    ),
    Opt("gpu"),
]
NumGpus = Annotated[
    int | None,
    Field(description="GPUs used (predict: required unless --study; explain: the run's by default)."),
    Opt("num_gpus", "-n"),
]
Tp = Annotated[
    int | None, Field(description="Tensor parallel size (default: all GPUs / (pp × dp))."), Opt("tp")
]
Pp = Annotated[int | None, Field(description="Pipeline stages."), Opt("pp")]
Ep = Annotated[int | None, Field(description="Expert parallel size (MoE)."), Opt("ep")]
DpAttention = Annotated[int | None, Field(description="Attention data parallel size."), Opt("dp_attention")]
Quant = Annotated[
    str | None,
    Field(description="Weight format override: bf16, fp8, nvfp4, mxfp4, int4, q4_k_m, ..."),
    Opt("quant"),
]
KvDtype = Annotated[
    str | None, Field(description="KV-cache dtype: bf16 or fp8 (default: the checkpoint's)."), Opt("kv_dtype")
]
Interconnect = Annotated[
    str | None,
    Field(description="nvlink3/4/5, pcie4-/pcie5-switch|cpu|xsocket (default: the GPU's usual)."),
    Opt("interconnect"),
]
SetupEngine = Annotated[
    str | None, Field(description="vllm, sglang or trtllm: engine-specific overhead factors."), Opt("engine")
]
Calibration = Annotated[
    str | None, Field(description="Apply a named calibration from `servelab calibrate`."), Opt("calibration")
]
Silicon = Annotated[
    bool,
    Field(
        description="Read the allreduce and routed experts off measured operator tables where they cover this "
        "GPU and engine (needs servelab[silicon]); `sources` says which terms are measured."
    ),
    Opt("silicon"),
]
Isl = Annotated[
    int | None, Field(description="Input tokens per request [default: the study's, else 1024]."), Opt("isl")
]
Osl = Annotated[
    int | None, Field(description="Output tokens per request [default: the study's, else 1024]."), Opt("osl")
]
ExplainOsl = Annotated[
    int | None,
    Field(description="Output tokens per request, used when the run does not record lengths."),
    Opt("osl"),
]
PredictConcurrency = Annotated[
    int | None,
    Field(description="Requests in flight [default: the study's main level, else 1]."),
    Opt("concurrency", "-c"),
]
StudyFile = Annotated[
    str | None,
    Field(
        description="Take the model, host, engine, lengths and load (its main level) from a study TOML; "
        "flags override."
    ),
    Opt("study"),
]
Sweep = Annotated[
    list[int],
    Field(description="Concurrency curve, e.g. 1,4,16,64."),
    Opt("sweep", cli_list="comma"),
]
TpotLimit = Annotated[
    float | None, Field(description="With --compare-layouts: TPOT limit, ms."), Opt("tpot_limit")
]
TtftLimit = Annotated[
    float | None, Field(description="With --compare-layouts: TTFT limit, ms."), Opt("ttft_limit")
]

# -- stored runs and studies ---------------------------------------------------------------------------

BenchRun = Annotated[
    str, Field(description="A stored bench run: uid (b-…), id or `last`."), Opt("run", argument=True)
]
StudyRef = Annotated[
    str, Field(description="A study: its uid (s-…), its name, or `last`."), Opt("study", cli=False)
]
ReportStudy = Annotated[
    str,
    Field(description="A study: its uid (s-…), its name, or `last`; or a bench run with --run."),
    Opt("study", argument=True),
]
ReportHtml = Annotated[
    str | None,
    Field(description="Write one self-contained HTML file (plots inline, opens without a network)."),
    Opt("html"),
]
ReportMd = Annotated[
    str | None,
    Field(description="Write Markdown; the plots go beside it as SVG files in FILE_STEM_files/."),
    Opt("md"),
]
TuneStudyFile = Annotated[
    str, Field(description="The study TOML (docs/study.md)."), Opt("study_file", argument=True)
]
RetryFailed = Annotated[
    bool, Field(description="With --resume: try candidates that failed again."), Opt("retry_failed")
]

# -- observing a machine (status, doctor, logs, plan check) -------------------------------------------------

Host = Annotated[
    str | None,
    Field(
        description="Act on this machine over SSH: ssh://[user@]host[:port] or an alias from ~/.ssh/config "
        "(default: $SERVELAB_HOST, else the study's [host] ssh, else this machine; 'local' forces this machine)."
    ),
    Opt("host"),
]
Urls = Annotated[
    list[str] | None,
    Field(description="A server to check (repeatable; default: the last run's)."),
    Opt("url", cli_list="repeat"),
]
Units = Annotated[
    list[str] | None,
    Field(description="A systemd unit to check (repeatable; default: servelab*)."),
    Opt("unit", cli_list="repeat"),
]
StatusLog = Annotated[
    str | None, Field(description="A server log to read (default: the last run's)."), Opt("log")
]
GpuSource = Annotated[
    str | None,
    Field(
        description="auto (default: a simulator among --url, else NVML, else nvidia-smi), nvml, nvidia-smi, or sim:URL."
    ),
    Opt("gpu_source"),
]
LogFile = Annotated[
    str | None, Field(description="The server log (or give --unit)."), Opt("file", argument=True)
]
LogUnit = Annotated[
    str | None,
    Field(
        description="Read the systemd journal of unit NAME instead of a FILE (e.g. the unit "
        "`servelab deploy --install` made)."
    ),
    Opt("unit"),
]
LogLines = Annotated[
    int | None, Field(description="With --unit: how many of the journal's last lines to read."), Opt("lines")
]
LogEngine = Annotated[
    str | None, Field(description="Engine that wrote the log (default: guessed from it)."), Opt("engine")
]
ParseEngine = Annotated[str, Field(description="Engine that wrote the log: vllm, sglang, ..."), Opt("engine")]
ServerInfo = Annotated[
    str | None,
    Field(
        description="JSON saved from the engine's info endpoint (SGLang /get_server_info, vLLM /version); "
        "it wins over the log."
    ),
    Opt("server_info"),
]
PlanRef = Annotated[
    str | None,
    Field(description="Which plan: `workspace` (default) or a study (uid, name or `last`)."),
    Opt("plan"),
]
PlanUrls = Annotated[
    list[str] | None,
    Field(description="A server to observe (repeatable; default: the servers the open items name)."),
    Opt("url", cli_list="repeat"),
]
PlanUnits = Annotated[
    list[str] | None,
    Field(description="A systemd unit to observe (repeatable; default: the units the open items name)."),
    Opt("unit", cli_list="repeat"),
]

# -- measuring a server (bench) ------------------------------------------------------------------------

ServerUrl = Annotated[
    str, Field(description="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000"), Opt("url")
]
ServedModel = Annotated[
    str, Field(description="Model name as the server serves it (see /v1/models)."), Opt("model")
]
Api = Annotated[
    Literal["completions", "chat"] | None, Field(description="The OpenAI route requests go to."), Opt("api")
]
Concurrency = Annotated[
    list[int] | None,
    Field(description="Closed-loop levels, comma-separated, e.g. 1,8,64."),
    Opt("concurrency", cli_list="comma"),
]
NumRequests = Annotated[int | None, Field(description="Requests per level."), Opt("num_requests")]
Duration = Annotated[
    float | None, Field(description="Seconds per level (instead of --num-requests)."), Opt("duration")
]
InputLen = Annotated[int | None, Field(description="Prompt tokens (synthetic)."), Opt("input_len")]
OutputLen = Annotated[int | None, Field(description="Output tokens to ask for."), Opt("output_len")]
Seed = Annotated[int | None, Field(description="Seed of the workload's random draws."), Opt("seed")]
Slo = Annotated[
    str | None, Field(description="Latency limits for goodput, e.g. ttft_ms<=500,tpot_ms<=50"), Opt("slo")
]

# -- deploying a run ---------------------------------------------------------------------------------------

DeployRun = Annotated[
    str, Field(description="RUN, STUDY (its winner), STUDY:CANDIDATE or trial:ID."), Opt("run", argument=True)
]
DeployTarget = Annotated[
    Literal["systemd", "compose", "kubernetes"],
    Field(description="What to write: a systemd unit, a Compose file or a Kubernetes manifest."),
    Opt("target"),
]
DeployName = Annotated[
    str | None, Field(description="Unit / service name (default: servelab-STUDYNAME)."), Opt("name")
]
DeployPort = Annotated[int | None, Field(description="Serve on this port instead of the run's."), Opt("port")]
DeployUser = Annotated[
    str | None, Field(description="User= for the unit / user for the container."), Opt("user")
]
EnvFile = Annotated[
    str | None,
    Field(
        description="EnvironmentFile= (systemd) / env_file (Compose) / a Secret NAME-env (Kubernetes) that "
        "supplies the run's secrets (e.g. VLLM_API_KEY for vLLM's --api-key); required when the run has one."
    ),
    Opt("env_file"),
]
