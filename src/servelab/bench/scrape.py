"""Server-side metrics: scrape Prometheus `/metrics` before, during and after a load level.

Each engine names its metrics differently; `ENGINE_METRICS` maps servelab's names to theirs
(vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are read). The engines' own TTFT and
inter-token histograms are read as sum and count, so a level also records what the server itself
measured over it: the client's numbers minus the server's are the client's own overhead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from servelab.jsontypes import JsonObject
from servelab.results import LevelSeries, SeriesPoint

# servelab name -> (kind, candidate metric names in order of preference)
ENGINE_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "requests_running": ("gauge", ("vllm:num_requests_running", "sglang:num_running_reqs")),
    "requests_waiting": ("gauge", ("vllm:num_requests_waiting", "sglang:num_queue_reqs")),
    "kv_cache_usage": (
        "gauge",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    ),
    "gen_throughput": ("gauge", ("sglang:gen_throughput",)),
    "generation_tokens": ("counter", ("vllm:generation_tokens_total", "sglang:generation_tokens_total")),
    "prompt_tokens": ("counter", ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total")),
    "preemptions": ("counter", ("vllm:num_preemptions_total", "vllm:num_preemptions")),
    "requests_finished": ("counter", ("vllm:request_success_total", "sglang:num_requests_total")),
    # prefix caching, in tokens (vLLM V1; `_total` as Prometheus exposes a counter), and SGLang's rate
    "prefix_cache_queries": ("counter", ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")),
    "prefix_cache_hits": ("counter", ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")),
    "cache_hit_rate": ("gauge", ("sglang:cache_hit_rate",)),
    # histograms: `<name>_sum` and `<name>_count` are read (seconds); vLLM and SGLang renamed the
    # per-token one from time_per_output_token to inter_token_latency
    "ttft": ("histogram", ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")),
    "itl": (
        "histogram",
        (
            "vllm:inter_token_latency_seconds",
            "sglang:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
            "sglang:time_per_output_token_seconds",
        ),
    ),
    "e2e": ("histogram", ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")),
}

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of each metric name over its labels (we serve one model per server)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = m.group(1)
        out[name] = out.get(name, 0.0) + value
    return out


def pick(raw: dict[str, float]) -> dict[str, float]:
    """servelab-named values from one scrape (only the metrics this server exposes)."""
    out: dict[str, float] = {}
    for ours, (kind, names) in ENGINE_METRICS.items():
        for name in names:
            if kind == "histogram":
                if name + "_sum" in raw and name + "_count" in raw:
                    out[ours + "_sum"], out[ours + "_count"] = raw[name + "_sum"], raw[name + "_count"]
                    break
            elif name in raw:
                out[ours] = raw[name]
                break
    return out


def detect_engine(raw: dict[str, float]) -> str | None:
    if any(k.startswith("vllm:") for k in raw):
        return "vllm"
    if any(k.startswith("sglang:") for k in raw):
        return "sglang"
    return None


@dataclass(frozen=True)
class GpuReading:
    """GPU telemetry at one instant, over the GPUs the server holds (`bench.telemetry` reads it)."""

    power_w: float | None
    util: float | None  # 0..1
    memory_used_mib: float | None
    gpus: int


_COUNTERS_PER_SAMPLE = ("preemptions", "generation_tokens")


@dataclass
class LevelScrape:
    """Scrapes taken over one level: the before/after snapshots and gauge samples in between."""

    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)
    errors: int = 0
    available: bool = True
    # beside `samples`, one per sample: when it was taken (time.perf_counter(), the client's clock) and
    # the GPU telemetry read with it (None: no GPU source, or it did not answer)
    sample_at: list[float] = field(default_factory=list)
    gpu_samples: list[GpuReading | None] = field(default_factory=list)

    def summary(self) -> JsonObject:
        if not self.available:
            return {"available": False}
        deltas: JsonObject = {}
        for ours, (kind, _) in ENGINE_METRICS.items():
            if kind == "counter" and ours in self.before and ours in self.after:
                deltas[ours] = self.after[ours] - self.before[ours]
        # the server's own mean over the level, in ms (observations of the level only: a delta)
        server_ms: JsonObject = {}
        for ours, (kind, _) in ENGINE_METRICS.items():
            keys = (ours + "_sum", ours + "_count")
            if kind == "histogram" and all(k in self.before and k in self.after for k in keys):
                n = self.after[keys[1]] - self.before[keys[1]]
                if n > 0:
                    server_ms[ours] = 1000 * (self.after[keys[0]] - self.before[keys[0]]) / n
        gauges: JsonObject = {}
        for ours, (kind, _) in ENGINE_METRICS.items():
            if kind != "gauge":
                continue
            vals = [s[ours] for s in self.samples if ours in s]
            if vals:
                gauges[ours] = {"mean": sum(vals) / len(vals), "max": max(vals), "last": vals[-1]}
        return {
            "available": True,
            "before": dict(self.before),
            "after": dict(self.after),
            "deltas": deltas,
            "server_mean_ms": server_ms,
            "gauges": gauges,
            "num_samples": len(self.samples),
            "scrape_errors": self.errors,
        }

    def series(self, origin: float, interval_s: float, gpu_source: str | None = None) -> LevelSeries:
        """The samples as a time series on the client's timeline: `t_s` = when each was taken minus
        `origin` (the level's start, the origin of `RequestRecord.start_s`); counters as the change since
        the sample before (a counter that went down, a restarted server, counts from zero)."""
        prev = {k: self.before.get(k) for k in _COUNTERS_PER_SAMPLE}
        points = []
        for i, (s, at) in enumerate(zip(self.samples, self.sample_at, strict=False)):
            delta: dict[str, float | None] = {}
            for k in _COUNTERS_PER_SAMPLE:
                now, was = s.get(k), prev[k]
                delta[k] = None if now is None or was is None else (now - was if now >= was else now)
                if now is not None:
                    prev[k] = now
            gpu = self.gpu_samples[i] if i < len(self.gpu_samples) else None
            points.append(
                SeriesPoint(
                    t_s=at - origin,
                    requests_running=s.get("requests_running"),
                    requests_waiting=s.get("requests_waiting"),
                    kv_cache_usage=s.get("kv_cache_usage"),
                    preemptions=delta["preemptions"],
                    generation_tokens=delta["generation_tokens"],
                    gpu_power_w=gpu.power_w if gpu else None,
                    gpu_util=gpu.util if gpu else None,
                    gpu_memory_used_mib=gpu.memory_used_mib if gpu else None,
                    gpus=gpu.gpus if gpu else None,
                )
            )
        return LevelSeries(interval_s=interval_s, gpu_source=gpu_source, points=points)
