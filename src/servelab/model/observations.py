"""Measurements a fit learns from: the published CSV's rows and a user's stored bench runs, as `Observation`s.

A row is read once into what ran (model, GPU, layout, quantization, engine, lengths, concurrency) and its
median TTFT/TPOT, undoing the CSV's own conventions (`_layout`, `_concurrency`) and the benchmark client's
length distribution (`bench_protocols`); `is_holdout` splits them by configuration, stably, for the fit's
held-out report (`model.calibrate`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject
from servelab.load import kind_of
from servelab.model.predict import Workload
from servelab.results import Run

SYSTEMS = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200-sxm",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200",
    "gb300": "gb300",
}
MODELS = {
    "deepseek-ai/DeepSeek-R1": "DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "DeepSeek-V3",
    "nvidia/DeepSeek-R1-NVFP4": "DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4": "DeepSeek-V3",
    "MiniMaxAI/MiniMax-M2.5": "MiniMax-M2.5",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "meta-llama/Llama-3.1-70B": "Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "Llama-3.1-8B",
    "Qwen/Qwen3-32B": "Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen3-32B",
    "Qwen/Qwen3.5-397B-A17B": "Qwen3.5-397B-A17B",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen3-235B-A22B",
}


@dataclass(frozen=True)
class Observation:
    """One measured configuration: what ran, and its median TTFT/TPOT."""

    model: str
    gpu: str
    num_gpus: int
    tp: int
    pp: int
    ep: int
    dp: int
    quant: str | None
    kv_dtype: str | None
    isl: int
    osl: int
    concurrency: int
    engine: str
    ttft_ms: float
    tpot_ms: float
    key: str = ""
    # mean / recorded ISL and OSL: the benchmark client's length distribution (`bench_protocols`)
    length_mean: float = 1.0

    @property
    def workload(self) -> Workload:
        """What the client sent on average: the recorded lengths scaled by the protocol's mean."""
        s = self.length_mean
        return Workload(max(1, round(self.isl * s)), max(1, round(self.osl * s)), self.concurrency)

    @property
    def system(self) -> str:
        return self.gpu

    @property
    def group(self) -> str:
        """The configuration a row measures, all concurrencies together: the unit the split holds out."""
        return "|".join(
            str(x)
            for x in (
                self.model,
                self.gpu,
                self.engine,
                self.tp,
                self.pp,
                self.dp,
                self.ep,
                self.quant,
                self.isl,
                self.osl,
            )
        )


def _int(v: str, default: int = 1) -> int:
    try:
        return int(float(v)) if v not in ("", None) else default
    except ValueError:
        return default


def _layout(row: dict[str, str]) -> tuple[int, int, int]:
    """(tp, attention-dp, ep) of a CSV row, undoing the squared GPU count some rows carry.

    Rows of 8-GPU boxes such as `tp 64, moe_tp 8, moe_ep 8` (or `attention_dp 64`) record the product
    of the MoE split as the attention split: the engines ran `--tp 8 --ep 8` on 8 GPUs (moe_tp = 1);
    64 GPUs cannot run an aggregated server on one HGX box, and the measured TPOT/TTFT scale like 8.
    When moe_tp == moe_ep > 1 and tp × dp equals their product, the real stage is moe_ep GPUs.
    Rows whose MoE split covers more GPUs than tp × dp with the attention-DP column left empty (vLLM
    `tp 1, moe_tp 2`: Qwen3-235B-FP8 on H200) ran attention data-parallel: dp = moe_tp × moe_ep / tp.
    Read as written they would put a 235 GB checkpoint on one 141 GB GPU.
    """
    tp, dp = max(_int(row.get("tp_size", "")), 1), max(_int(row.get("attention_dp_size", "")), 1)
    ep = max(_int(row.get("moe_ep_size", "")), 1)
    moe_tp = max(_int(row.get("moe_tp_size", "")), 1)
    if moe_tp == ep > 1 and tp * dp == moe_tp * ep:
        if dp == 1:
            tp = ep
        elif tp == 1:
            dp = ep
    elif tp * dp < moe_tp * ep and (moe_tp * ep) % (tp * dp) == 0:
        # the MoE stage spans more GPUs than one attention group (vLLM rows `tp 1, moe_tp 2` with the
        # attention-DP column left empty): the other attention groups are data-parallel ranks
        dp = moe_tp * ep // tp
    return tp, dp, ep


def _concurrency(row: dict[str, str]) -> int:
    """Requests in flight on one server: `batch_size` × `attention_dp_size`.

    `batch_size` is the aiconfigurator batch *per attention-DP rank*: a DeepSeek-R1 run recorded as
    (attention_dp 8, batch 32) appears again as (attention_dp 64, batch 4), and its client kept 256
    requests in flight (`silicon_concurrency=256` in `silicon_data_source`). Rows without attention-DP
    whose `silicon_concurrency` is a multiple of the batch ran several replicas (32 × TP2 Qwen3-32B on a
    GB200 rack: 448 = 32 × 14); one server then sees `batch_size` requests."""
    return max(_int(row.get("batch_size", "")), 1) * max(_int(row.get("attention_dp_size", "")), 1)


def _quant(row: dict[str, str], model: str) -> str | None:
    modes = {row.get("gemm_quant_mode", ""), row.get("moe_quant_mode", ""), row.get("precision", "")}
    if model == "gpt-oss-120b":
        return None  # MXFP4 experts as shipped
    if "nvfp4" in modes:
        return "nvfp4"
    if modes & {"fp8", "fp8_block"}:
        return "fp8"
    return "bf16"


def _kv_dtype(engine: str, quant: str | None) -> str | None:
    """The KV-cache dtype an engine runs by default: TensorRT-LLM stores FP8 KV for FP8/NVFP4
    checkpoints; vLLM and SGLang keep `--kv-cache-dtype auto`, i.e. the activation dtype (BF16)."""
    return "fp8" if engine == "trtllm" and quant in ("fp8", "nvfp4") else None


@functools.cache
def bench_protocols() -> dict[str, JsonObject]:
    """How published measurement sources ran their benchmark client (`data/bench_protocols.toml`)."""
    return tomllib.loads(resources.files("servelab.data").joinpath("bench_protocols.toml").read_text())


def length_mean(source: str) -> float:
    """Mean / recorded request length for a row's `silicon_data_source`: (1 + r)/2 for a client drawing
    lengths uniformly from [r·L, L] (`random_range_ratio` r), 1 for fixed lengths or an unknown source."""
    for proto in bench_protocols().values():
        match, ratio = proto.get("match", []), proto.get("random_range_ratio", 1.0)
        if isinstance(match, list) and any(isinstance(m, str) and m in source for m in match):
            return (1.0 + (float(ratio) if isinstance(ratio, int | float) else 1.0)) / 2.0
    return 1.0


def observations_from_csv(path: Path | str) -> list[Observation]:
    """Aggregated (`mode == agg`) rows of a serving_measurements.csv, for models in the catalog."""
    out: list[Observation] = []
    try:
        fh = open(path, newline="")  # noqa: SIM115
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    with fh:
        for row in csv.DictReader(fh):
            if row.get("mode") != "agg" or row.get("system") not in SYSTEMS:
                continue
            model = MODELS.get(row.get("model_path", ""))
            if not model:
                continue
            try:
                ttft, tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
            except (KeyError, ValueError):
                continue
            tp, dp, ep = _layout(row)
            q = _quant(row, model)
            out.append(
                Observation(
                    model=model,
                    gpu=SYSTEMS[row["system"]],
                    num_gpus=tp * dp,
                    tp=tp,
                    pp=max(_int(row.get("pp_size", "")), 1),
                    ep=ep,
                    dp=dp,
                    quant=q,
                    kv_dtype=_kv_dtype(row.get("backend", ""), q),
                    isl=_int(row["isl"]),
                    osl=_int(row["osl"]),
                    concurrency=_concurrency(row),
                    engine=row.get("backend", ""),
                    ttft_ms=ttft,
                    tpot_ms=tpot,
                    key=row.get("id", ""),
                    length_mean=length_mean(row.get("silicon_data_source", "")),
                )
            )
    return out


def is_holdout(obs: Observation, fraction: float = 0.3) -> bool:
    """A stable split by configuration group (model, system, engine, layout, quantization, ISL/OSL): every
    concurrency level and repeat of a held-out configuration is held out together, so a test row never has
    a duplicate or a neighbouring concurrency of the same configuration in the training set."""
    h = int(hashlib.sha256(obs.group.encode()).hexdigest()[:8], 16)
    return (h % 1000) < fraction * 1000


def holdout_mask(obs: Sequence[Observation], fraction: float = 0.3) -> np.ndarray:
    """Rows held out by `is_holdout`; none when the split would leave nothing to fit (a user's runs of a
    single configuration are one group, which the hash puts wholly on one side)."""
    mask = (
        np.array([is_holdout(o, fraction) for o in obs], bool) if fraction > 0 else np.zeros(len(obs), bool)
    )
    return np.zeros(len(obs), bool) if mask.all() else mask


def observations_from_runs(runs: list[Run]) -> list[Observation]:
    """Measured levels of stored bench runs whose context names the host (GPU) and the layout, in the
    GPU time they stand for. Levels with no completed request or no TPOT are left out."""
    out: list[Observation] = []
    for run in runs:
        ctx = run.context
        host, layout = ctx.host, ctx.layout
        if not host.gpu:
            continue
        for lv in run.levels:
            s = lv.summary
            tpot, ttft = s.tpot_ms.p50, s.ttft_ms.p50
            if not tpot or not ttft or not kind_of(lv.mode).closed_loop:
                continue
            tp = int(layout.tp or host.num_gpus or 1)
            dp = int(layout.dp or 1)
            pp = int(layout.pp or 1)
            out.append(
                Observation(
                    model=ctx.model_config_ref or run.model,
                    gpu=host.gpu,
                    num_gpus=min(int(host.num_gpus or tp * dp * pp), tp * dp * pp),
                    tp=tp,
                    pp=pp,
                    ep=int(layout.ep or 1),
                    dp=dp,
                    quant=ctx.quant,
                    kv_dtype=ctx.kv_dtype,
                    isl=round(s.mean_input_tokens or 1024),
                    osl=round(s.mean_output_tokens or 1024),
                    concurrency=s.concurrency,
                    engine=str(ctx.personality or ctx.engine or ""),
                    ttft_ms=float(ttft),
                    tpot_ms=float(tpot),
                    key=f"{run.uid}:{lv.value:g}",
                )
            )
    return out
