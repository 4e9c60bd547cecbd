"""The performance model as the search's prior: it ranks points before any runs, and is refitted from
the study's own measured runs (`calibrate`'s few-observation fit) as they arrive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.errors import ServelabError
from servelab.load import LoadKind, ModelConcurrency
from servelab.model.factors import Factors, default_factors
from servelab.objectives import objective as objective_of

if TYPE_CHECKING:
    from servelab.model.predict import Prediction
    from servelab.results import Run

# Engine flags whose meaning the model has a lever for: the running-batch cap (the model's concurrency is
# at most it) and the prefill chunk (the model's `prefill_budget`). vLLM's and SGLang's spellings.
RUNNING_CAP = ("max_running_requests", "max_num_seqs")
PREFILL_CHUNK = ("chunked_prefill_size", "max_num_batched_tokens")


def _flag(cand: CandidateSpec, names: tuple[str, ...]) -> int | None:
    args = cand.args
    for i, a in enumerate(args[:-1]):
        if a.lstrip("-").replace("-", "_") in names:
            try:
                return int(float(args[i + 1]))
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class Predicted:
    value: float | None  # the objective, as the model predicts it at the study's main level
    feasible: bool
    reason: str | None = None


def prediction(
    study: Study, cand: CandidateSpec, concurrency: int, factors: Factors | None = None
) -> Prediction:
    """The model's prediction for a candidate at `concurrency` (factors: the engine's defaults unless
    given). Raises the model's ServelabError when it does not know the setup."""
    from servelab.model.predict import Workload
    from servelab.model.predict import predict as model_predict

    assert study.host.gpu is not None
    return model_predict(
        study.model.config or study.model.path,
        study.host.gpu,
        study.host.num_gpus,
        Workload(isl=study.workload.input_len, osl=study.workload.output_len, concurrency=concurrency),
        tp=cand.tp,
        pp=cand.pp,
        ep=cand.ep or 1,
        dp=cand.dp or 1,
        quant=cand.quantization,
        kv_dtype=cand.kv_cache_dtype,
        factors=factors,
        engine=str(study.engine.options.get("personality", study.engine.name)),
        silicon=study.model.silicon,
    )


def model_concurrency(
    study: Study,
    cand: CandidateSpec,
    kind: LoadKind | None = None,
    factors: Factors | None = None,
    value: float | None = None,
) -> ModelConcurrency:
    """The study's main level (or the level `value`) as the concurrency the model predicts a candidate at:
    a closed loop's level; an open loop's offered rate met by the model's request rate (servelab.load)."""
    kind = kind or study.load_kind(read_trace=True)
    osl = study.workload.output_len

    def rate_at(concurrency: int) -> float | None:
        try:
            p = prediction(study, cand, concurrency, factors)
        except ServelabError:
            return None
        if not p.feasible or not p.output_throughput:
            return None
        return float(p.output_throughput) / osl

    return kind.as_concurrency_for_model(kind.main if value is None else value, rate_at, study.sim_speed())


def predict(
    study: Study, cand: CandidateSpec, factors: Factors | None = None, objective: str | None = None
) -> Predicted:
    """The model's objective for a candidate at the study's main level, with the flags it has a lever for
    (the running-batch cap, the prefill chunk); value None when it cannot say."""
    objective = objective or study.objective
    if not study.host.gpu:
        return Predicted(None, True, "the study declares no GPU kind (host.gpu)")
    engine = str(study.engine.options.get("personality", study.engine.name))
    f = factors or default_factors(engine, study.model.silicon)
    chunk = _flag(cand, PREFILL_CHUNK)
    if chunk:
        f = f.merged({"prefill_budget": float(chunk)})
    at = model_concurrency(study, cand, factors=f)
    if at.concurrency is None:
        return Predicted(None, True, at.reason)
    conc = at.concurrency
    cap = running_cap(cand)
    if cap:
        conc = min(conc, cap)
    try:
        p = prediction(study, cand, conc, f)
    except ServelabError as exc:
        return Predicted(None, False, exc.message)
    except Exception as exc:  # the model's own gaps must not stop a search
        return Predicted(None, True, f"model error: {exc}")
    if not p.feasible:
        return Predicted(None, False, p.reason)
    value = getattr(p, objective_of(objective).predicted_as)
    return Predicted(float(value) if value is not None else None, True)


def better(objective: str) -> float:
    """+1 when higher is better, -1 when lower is."""
    return objective_of(objective).sign


def running_cap(cand: CandidateSpec) -> int | None:
    """The most requests the candidate's engine runs at once, when a flag or field caps it."""
    return _flag(cand, RUNNING_CAP) or cand.max_concurrency


def refit(study: Study, runs: list[tuple[Run, CandidateSpec]]) -> tuple[Factors | None, list[str]]:
    """Factors fitted from the study's measured bench runs (None before any has a usable level), and the
    names of the factors the fit moved. A level above a candidate's running-batch cap is left out: the
    engine ran the cap, not the level, and the fit's rows know only the level."""
    from servelab.model.calibrate import fit_observations
    from servelab.model.observations import observations_from_runs

    obs = []
    for run, cand in runs:
        cap = running_cap(cand)
        obs += [o for o in observations_from_runs([run]) if cap is None or o.concurrency <= cap]
    if not obs:
        return None, []
    engine = str(study.engine.options.get("personality", study.engine.name))
    try:
        silicon = study.model.silicon
        glob, _engines, report = fit_observations(
            obs, default_factors(engine, silicon), holdout=0.0, silicon=silicon
        )
    except Exception:  # a fit that cannot converge leaves the model as it was
        return None, []
    fitted = report.get("fitted") or []
    return glob, [str(n) for n in fitted] if isinstance(fitted, list) else []
