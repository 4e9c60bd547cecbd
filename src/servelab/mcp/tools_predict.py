"""The performance model: `predict`, `predict_sweep`, `compare_layouts`, `explain`, each `servelab predict`
(or `explain`) run as a child with the tool's arguments as its options."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, call, flags
from servelab.mcp.studies import Studies

# The parameters several of these tools take, each declared once (the schemas are those of before).
SetupModel = Annotated[str | None, Field(description="Catalog name (GLM-5-NVFP4, …) or a config.json.")]
Gpu = Annotated[str | None, Field(description="GPU kind: rtx-pro-6000, h200-sxm, …")]
Engine = Annotated[str | None, Field(description="vllm, sglang or trtllm.")]
StudyFile = Annotated[str | None, Field(description="Take the setup from this study TOML.")]
Silicon = Annotated[
    bool,
    Field(
        description="Read the allreduce and routed experts off measured operator tables (`sources` says which)."
    ),
]


async def predict(
    model: SetupModel = None,
    gpu: Gpu = None,
    num_gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    dp_attention: int | None = None,
    quant: str | None = None,
    kv_dtype: str | None = None,
    interconnect: str | None = None,
    engine: Engine = None,
    calibration: str | None = None,
    isl: int | None = None,
    osl: int | None = None,
    concurrency: int | None = None,
    study: StudyFile = None,
    silicon: Silicon = False,
) -> M.PredictionView:
    """Predicted TTFT, TPOT, throughput and memory for one setup, and where the decode step goes."""
    args = flags(
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        dp_attention=dp_attention,
        quant=quant,
        kv_dtype=kv_dtype,
        interconnect=interconnect,
        engine=engine,
        calibration=calibration,
        isl=isl,
        osl=osl,
        concurrency=concurrency,
        study=study,
        silicon=silicon,
    )
    return await call(M.PredictionView, ["predict", *args])


async def predict_sweep(
    sweep: Annotated[list[int], Field(description="The concurrencies of the curve, e.g. [1, 4, 16, 64].")],
    model: SetupModel = None,
    gpu: Gpu = None,
    num_gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    dp_attention: int | None = None,
    quant: str | None = None,
    kv_dtype: str | None = None,
    interconnect: str | None = None,
    engine: Engine = None,
    calibration: str | None = None,
    isl: int | None = None,
    osl: int | None = None,
    study: StudyFile = None,
    silicon: Silicon = False,
) -> M.SweepView:
    """The predicted concurrency curve of one setup: TPOT, TTFT and throughput at each level
    (`servelab predict --sweep`)."""
    args = flags(
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        dp_attention=dp_attention,
        quant=quant,
        kv_dtype=kv_dtype,
        interconnect=interconnect,
        engine=engine,
        calibration=calibration,
        isl=isl,
        osl=osl,
        study=study,
        silicon=silicon,
    )
    return await call(M.SweepView, ["predict", *args, "--sweep", ",".join(str(c) for c in sweep)])


async def compare_layouts(
    model: str | None = None,
    gpu: str | None = None,
    num_gpus: int | None = None,
    engine: str | None = None,
    quant: str | None = None,
    kv_dtype: str | None = None,
    interconnect: str | None = None,
    isl: int | None = None,
    osl: int | None = None,
    concurrency: int | None = None,
    tpot_limit: Annotated[float | None, Field(description="TPOT limit, ms.")] = None,
    ttft_limit: Annotated[float | None, Field(description="TTFT limit, ms.")] = None,
    study: str | None = None,
    silicon: Silicon = False,
) -> M.LayoutsView:
    """Every TP/PP/EP/DP layout for this host, ranked under the limits."""
    args = flags(
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        engine=engine,
        quant=quant,
        kv_dtype=kv_dtype,
        interconnect=interconnect,
        isl=isl,
        osl=osl,
        concurrency=concurrency,
        tpot_limit=tpot_limit,
        ttft_limit=ttft_limit,
        study=study,
        silicon=silicon,
    )
    return await call(M.LayoutsView, ["predict", "--compare-layouts", *args])


async def explain(
    run: Annotated[str, Field(description="A stored bench run: uid (b-…), id or `last`.")] = "last",
    model: str | None = None,
    gpu: str | None = None,
    num_gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    engine: str | None = None,
    osl: int | None = None,
    silicon: Silicon = False,
) -> M.ExplainView:
    """A measured run against the model: where its time goes and how far the prediction is off."""
    args = flags(
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        engine=engine,
        osl=osl,
        silicon=silicon,
    )
    return await call(M.ExplainView, ["explain", run, *args])


def group(opts: Options, runs: Studies) -> Group:
    return Group([predict, predict_sweep, compare_layouts, explain])
