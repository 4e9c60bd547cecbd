"""The report of one plain bench run (`servelab report RUN`): one typed model, read from the store once
(`load`) and built by `build`, which Markdown, HTML and `--json` all render.

Everything is in the run's time base (`results.Run`: a simulator run's figures in the GPU time it
simulates): latencies and times × the clock's speed, throughputs ÷ it. The client's side over time is
rebuilt from the stored requests: each streamed chunk's arrival (start + TTFT + the inter-chunk gaps)
binned on the same timeline as the server's `/metrics` samples (`results.LevelSeries`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from servelab.bench.metrics import tpot_s
from servelab.jsontypes import JsonObject
from servelab.report.pareto import ParetoPoint, point, throughput_front
from servelab.results import LevelSeries, RequestRecord, Run
from servelab.store.bench import BenchRepo
from servelab.store.db import Store

FORMAT = "servelab-run-report/1"
CDF_POINTS = 200  # a CDF keeps at most this many points (quantiles) however many requests a level had
BINS_MAX = 120  # the client's timeline: at most this many bins a level


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunHead(_M):
    uid: str
    status: str
    model: str
    url: str
    api: str
    engine: str | None
    personality: str | None
    created_at: str
    finished_at: str | None
    time_base: str
    clock_speed: float
    workload: JsonObject
    gpu: str | None
    num_gpus: int | None
    layout: str | None
    mode: str  # concurrency | rate
    warnings: list[str]
    gpus: int  # what a per-GPU figure divides by: the layout's tp × pp × dp, else the host's GPUs, else 1
    gpus_from: str  # where `gpus` came from, in words


class LevelRow(_M):
    """One level's headline numbers (the same names as a study's level digest)."""

    index: int
    label: str
    status: str
    level: float
    completed: int
    failed: int
    errors: dict[str, int]
    error_examples: dict[str, str] = {}  # kind -> the server's own words for one such failure
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    e2e_ms_p50: float | None
    e2e_ms_p99: float | None
    gpu_power_w: float | None  # mean over the level's samples (None: no GPU telemetry)
    j_per_output_token: float | None = None  # LevelSummary.energy (None: no power seen)
    usd_per_m_output_tokens: float | None = None  # LevelSummary.cost (None: no price)


class Cdf(_M):
    """Empirical CDF of one latency over a level's successful requests: `points` are (ms, fraction ≤)."""

    metric: str  # ttft_ms | tpot_ms
    count: int
    points: list[tuple[float, float]]


class LevelCdfs(_M):
    index: int
    label: str
    ttft: Cdf
    tpot: Cdf


class ClientBin(_M):
    """The client's view of one time bin: `t_s` its middle; output tokens/s streamed in it; the median
    TTFT and TPOT of the requests sent in it (None: none sent)."""

    t_s: float
    output_throughput: float
    requests_sent: int
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None


class Timeline(_M):
    """One level over time: the server's samples and the client's bins on one time axis."""

    index: int
    label: str
    bin_s: float
    client: list[ClientBin]
    series: LevelSeries
    peak_waiting: float | None
    samples: int


class RunReport(_M):
    format: str = FORMAT
    run: RunHead
    levels: list[LevelRow]
    cdfs: list[LevelCdfs] = Field(default_factory=list)
    timelines: list[Timeline] = Field(default_factory=list)
    # output tok/s per GPU against tok/s per user: every level, and the levels no other beats on both
    pareto_points: list[ParetoPoint] = Field(default_factory=list)
    pareto_front: list[ParetoPoint] = Field(default_factory=list)

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")


def load(store: Store, ref: str) -> RunReport:
    """The report of bench run `ref` (uid, unique uid prefix, numeric id or `last`)."""
    repo = BenchRepo(store)
    run = repo.load(ref)
    ids = repo.level_ids(run.id)
    records = {lv.index: repo.requests(ids[lv.index]) for lv in run.levels if lv.index in ids}
    return build(run, records)


def build(run: Run, records: dict[int, list[RequestRecord]]) -> RunReport:
    speed = run.clock.speed
    ctx = run.context
    lay = ", ".join(f"{k}={v}" for k, v in ctx.layout.model_dump().items() if v is not None) or None
    gpus, gpus_from = _gpus(ctx.layout.gpus, ctx.host.num_gpus)
    head = RunHead(
        uid=run.uid,
        status=run.status,
        model=run.model,
        url=run.url,
        api=run.api,
        engine=run.engine,
        personality=ctx.personality,
        created_at=run.created_at,
        finished_at=run.finished_at,
        time_base=run.clock.time_base,
        clock_speed=speed,
        workload=run.workload.model_dump(exclude_none=True),
        gpu=ctx.host.gpu,
        num_gpus=ctx.host.num_gpus,
        layout=lay,
        mode=str(run.config.get("mode") or (run.levels[0].mode if run.levels else "concurrency")),
        warnings=run.warnings,
        gpus=gpus,
        gpus_from=gpus_from,
    )
    levels: list[LevelRow] = []
    cdfs: list[LevelCdfs] = []
    timelines: list[Timeline] = []
    for lv in run.levels:
        s = lv.summary
        power = [p.gpu_power_w for p in lv.series.points if p.gpu_power_w is not None]
        levels.append(
            LevelRow(
                index=lv.index,
                label=s.label or f"{lv.value:g}",
                status=lv.status,
                level=lv.value,
                completed=s.completed,
                failed=s.failed,
                errors=dict(s.errors),
                error_examples=dict(s.error_examples),
                request_throughput=s.request_throughput,
                output_throughput=s.output_throughput,
                total_token_throughput=s.total_token_throughput,
                goodput=s.goodput,
                ttft_ms_p50=s.ttft_ms.p50,
                ttft_ms_p99=s.ttft_ms.p99,
                tpot_ms_p50=s.tpot_ms.p50,
                tpot_ms_p99=s.tpot_ms.p99,
                itl_ms_p50=s.itl_ms.p50,
                itl_ms_p99=s.itl_ms.p99,
                e2e_ms_p50=s.e2e_ms.p50,
                e2e_ms_p99=s.e2e_ms.p99,
                gpu_power_w=sum(power) / len(power) if power else None,
                j_per_output_token=s.energy.j_per_output_token if s.energy else None,
                usd_per_m_output_tokens=s.cost.usd_per_m_output_tokens if s.cost else None,
            )
        )
        recs = records.get(lv.index, [])
        ok = [r for r in recs if r.ok]
        ttft = [r.ttft_s * 1000 * speed for r in ok if r.ttft_s is not None]
        tpot = [t * 1000 * speed for r in ok if (t := tpot_s(r)) is not None]
        cdfs.append(
            LevelCdfs(
                index=lv.index, label=levels[-1].label, ttft=cdf("ttft_ms", ttft), tpot=cdf("tpot_ms", tpot)
            )
        )
        timelines.append(timeline(lv.index, levels[-1].label, recs, lv.series, lv.wall_series, speed))
    points = [
        p
        for lv in levels
        if (p := point(run.uid, lv.level, lv.output_throughput, lv.tpot_ms_p50, gpus)) is not None
    ]
    return RunReport(
        run=head,
        levels=levels,
        cdfs=cdfs,
        timelines=timelines,
        pareto_points=points,
        pareto_front=throughput_front(points),
    )


def _gpus(layout: int | None, host: int | None) -> tuple[int, str]:
    """The GPUs the run's server held, and where that count came from."""
    if layout:
        return layout, "the run's layout (tp × pp × dp)"
    if host:
        return host, "the host's GPU count (the run recorded no layout)"
    return 1, "not recorded: taken as 1"


def cdf(metric: str, values: list[float], n: int = CDF_POINTS) -> Cdf:
    """The empirical CDF of `values`: every value when there are at most `n`, else `n` quantiles."""
    xs = sorted(v for v in values if math.isfinite(v))
    if not xs:
        return Cdf(metric=metric, count=0, points=[])
    if len(xs) <= n:
        pts = [(x, (i + 1) / len(xs)) for i, x in enumerate(xs)]
    else:
        pts = []
        for k in range(1, n + 1):
            i = min(len(xs) - 1, math.ceil(k / n * len(xs)) - 1)
            pts.append((xs[i], (i + 1) / len(xs)))
    return Cdf(metric=metric, count=len(xs), points=pts)


def _median(vs: list[float]) -> float | None:
    if not vs:
        return None
    s = sorted(vs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def timeline(
    index: int,
    label: str,
    recs: list[RequestRecord],
    series: LevelSeries,
    wall_series: LevelSeries,
    speed: float,
) -> Timeline:
    """The client's throughput and latency in bins of the scrape interval (at least level / BINS_MAX), on the
    client's clock, then shown in the run's time base beside the server's `series`."""
    ends = [r.end_s for r in recs if r.end_s is not None]
    span = max([*ends, *(p.t_s for p in wall_series.points), 0.0])
    width = max(wall_series.interval_s or 0.0, span / BINS_MAX if span else 0.0) or 1.0
    nbins = max(1, math.ceil(span / width)) if span else 0
    tokens = [0.0] * nbins
    sent: list[list[RequestRecord]] = [[] for _ in range(nbins)]
    for r in recs:
        b = min(nbins - 1, int(r.start_s / width)) if nbins else None
        if b is not None:
            sent[b].append(r)
        if not r.ok or r.ttft_s is None or not nbins:
            continue
        chunks = [r.start_s + r.ttft_s]
        for gap in r.itl_s:
            chunks.append(chunks[-1] + gap)
        per = (r.output_tokens or len(chunks)) / len(chunks)
        for at in chunks:
            tokens[min(nbins - 1, int(at / width))] += per
    bins = []
    for b in range(nbins):
        ok = [r for r in sent[b] if r.ok]
        ttft = [r.ttft_s * 1000 * speed for r in ok if r.ttft_s is not None]
        tpot = [t * 1000 * speed for r in ok if (t := tpot_s(r)) is not None]
        bins.append(
            ClientBin(
                t_s=(b + 0.5) * width * speed,
                output_throughput=tokens[b] / width / speed,
                requests_sent=len(sent[b]),
                ttft_ms_p50=_median(ttft),
                tpot_ms_p50=_median(tpot),
            )
        )
    waiting = [p.requests_waiting for p in series.points if p.requests_waiting is not None]
    return Timeline(
        index=index,
        label=label,
        bin_s=width * speed,
        client=bins,
        series=series,
        peak_waiting=max(waiting) if waiting else None,
        samples=len(series.points),
    )
