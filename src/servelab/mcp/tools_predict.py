"""The performance model: `predict`, `predict_sweep`, `compare_layouts`, `explain`, each `servelab predict`
(or `explain`) run as a child with the tool's arguments as its options."""

from __future__ import annotations

from servelab import arguments as A
from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, call, flags
from servelab.mcp.studies import Studies


async def predict(
    model: A.SetupModel = None,
    gpu: A.Gpu = None,
    num_gpus: A.NumGpus = None,
    tp: A.Tp = None,
    pp: A.Pp = None,
    ep: A.Ep = None,
    dp_attention: A.DpAttention = None,
    quant: A.Quant = None,
    kv_dtype: A.KvDtype = None,
    interconnect: A.Interconnect = None,
    engine: A.SetupEngine = None,
    calibration: A.Calibration = None,
    isl: A.Isl = None,
    osl: A.Osl = None,
    concurrency: A.PredictConcurrency = None,
    study: A.StudyFile = None,
    silicon: A.Silicon = False,
) -> M.PredictionView:
    """Predicted TTFT, TPOT, throughput and memory for one setup, and where the decode step goes."""
    params = dict(locals())  # the tool's arguments, each its option of the same name
    args = flags(**params)
    return await call(M.PredictionView, ["predict", *args])


async def predict_sweep(
    sweep: A.Sweep,
    model: A.SetupModel = None,
    gpu: A.Gpu = None,
    num_gpus: A.NumGpus = None,
    tp: A.Tp = None,
    pp: A.Pp = None,
    ep: A.Ep = None,
    dp_attention: A.DpAttention = None,
    quant: A.Quant = None,
    kv_dtype: A.KvDtype = None,
    interconnect: A.Interconnect = None,
    engine: A.SetupEngine = None,
    calibration: A.Calibration = None,
    isl: A.Isl = None,
    osl: A.Osl = None,
    study: A.StudyFile = None,
    silicon: A.Silicon = False,
) -> M.SweepView:
    """The predicted concurrency curve of one setup: TPOT, TTFT and throughput at each level
    (`servelab predict --sweep`)."""
    params = dict(locals())  # the tool's arguments, each its option of the same name
    del params["sweep"]  # one comma-separated value (below), not the option repeated
    args = flags(**params)
    return await call(M.SweepView, ["predict", *args, "--sweep", ",".join(str(c) for c in sweep)])


async def compare_layouts(
    model: A.SetupModel = None,
    gpu: A.Gpu = None,
    num_gpus: A.NumGpus = None,
    engine: A.SetupEngine = None,
    quant: A.Quant = None,
    kv_dtype: A.KvDtype = None,
    interconnect: A.Interconnect = None,
    isl: A.Isl = None,
    osl: A.Osl = None,
    concurrency: A.PredictConcurrency = None,
    tpot_limit: A.TpotLimit = None,
    ttft_limit: A.TtftLimit = None,
    study: A.StudyFile = None,
    silicon: A.Silicon = False,
) -> M.LayoutsView:
    """Every TP/PP/EP/DP layout for this host, ranked under the limits."""
    params = dict(locals())  # the tool's arguments, each its option of the same name
    args = flags(**params)
    return await call(M.LayoutsView, ["predict", "--compare-layouts", *args])


async def explain(
    run: A.BenchRun = "last",
    model: A.SetupModel = None,
    gpu: A.Gpu = None,
    num_gpus: A.NumGpus = None,
    tp: A.Tp = None,
    pp: A.Pp = None,
    ep: A.Ep = None,
    engine: A.SetupEngine = None,
    osl: A.ExplainOsl = None,
    silicon: A.Silicon = False,
) -> M.ExplainView:
    """A measured run against the model: where its time goes and how far the prediction is off."""
    params = dict(locals())  # the tool's arguments, each its option of the same name
    del params["run"]  # the command's argument
    args = flags(**params)
    return await call(M.ExplainView, ["explain", run, *args])


def group(opts: Options, runs: Studies) -> Group:
    return Group([predict, predict_sweep, compare_layouts, explain])
