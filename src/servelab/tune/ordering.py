"""Before a study runs: its identity (`spec_hash`), the model's view of each candidate and the order they run
in (most promising first, the baseline before all), and the preflight that derives every launch first."""

from __future__ import annotations

import hashlib

import orjson

from servelab import naming
from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.engines.base import Engine
from servelab.errors import ConfigError, ServelabError, UserError
from servelab.host import transport
from servelab.jsontypes import JsonObject
from servelab.lifecycle.handle import check_marker
from servelab.model.hardware import default_price
from servelab.objectives import objective
from servelab.trial.prepare import bench_config, settings_for
from servelab.tune.flagcheck import check_study_flags


def spec_hash(study: Study) -> str:
    # Where the trials run is not what is studied: a study resumes on another executor. A study without
    # [cost] hashes as it did before the table existed.
    unset = {"cost"} if study.cost.gpu_hour_usd is None and study.cost.kwh_usd is None else set()
    return hashlib.sha256(
        orjson.dumps(study.model_dump(mode="json", exclude={"executor", *unset}), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()[:16]


def predict_candidate(study: Study, cand: CandidateSpec) -> JsonObject | None:
    """The model's view of a candidate at the study's main level, or None when it does not know the setup:
    stored with the candidate as it is (open JSON), read back only for its `output_throughput`."""
    if not study.host.gpu:
        return None
    kind = study.load_kind(read_trace=True)
    load = kind.describe()
    try:
        from servelab.search.prior import model_concurrency, prediction

        conc = model_concurrency(study, cand, kind)
        if conc.concurrency is None:
            return {"feasible": False, "reason": conc.reason, "known": False, "load": load}
        p = prediction(study, cand, conc.concurrency)
    except ServelabError as exc:
        return {"feasible": False, "reason": exc.message, "known": False, "load": load}
    except Exception as exc:  # the model's own gaps must not stop a study
        return {"feasible": False, "reason": f"model error: {exc}", "known": False, "load": load}
    d = p.to_dict()
    return {
        "known": True,
        **{
            k: d.get(k)
            for k in (
                "feasible",
                "reason",
                "tpot_ms",
                "ttft_ms",
                "output_throughput",
                "allreduce_share",
                "single_stream_ceiling_tok_s",
            )
        },
        "concurrency": conc.concurrency,
        "load": load,
    }


def order_candidates(study: Study) -> list[tuple[CandidateSpec, JsonObject | None]]:
    """Most promising first when the model knows the setup (infeasible last); file order otherwise."""
    pairs = [(c, predict_candidate(study, c)) for c in study.candidates]

    def key(item: tuple[int, tuple[CandidateSpec, JsonObject | None]]) -> tuple[int, float, int]:
        i, (_c, p) = item
        if not p or not p.get("known"):
            return (1, 0.0, i)
        if not p.get("feasible"):
            return (2, 0.0, i)
        thr = p.get("output_throughput")
        return (0, -(thr if isinstance(thr, int | float) and thr else 0.0), i)

    ordered = [pair for _i, pair in sorted(enumerate(pairs), key=key)]
    # The baseline runs first: anomalies of the others are judged against it as they run.
    base = study.baseline_label()
    return sorted(ordered, key=lambda pair: pair[0].label() != base)


def preflight(
    study: Study, engine: Engine, host: transport.Host | None = None, *, reachable: bool = True
) -> list[str]:
    """Everything the real run derives for a candidate before launching it, derived for every candidate
    now: its settings, the engine's command line (which refuses impossible input), its engine flags
    checked against the engine installed where it runs (`host`, None: this machine; see
    `tune.flagcheck`), its run marker and its log file name. The dry run and the real run both call this
    first, so a study the dry run accepts never stops at a launch, and one it refuses has started
    nothing and stored nothing. Returns the notes of the flag check (what each schema was read from, or
    why an engine's flags were not checked)."""
    problems: list[str] = []
    try:  # the benchmark's configuration is built after the server is up: build it now
        bench_config(study, "http://127.0.0.1:1", study.model.served_name or study.model.path)
    except UserError as exc:
        problems.append(f"  workload/load: {exc.message}")
    checks = [(study.where(i), c) for i, c in enumerate(study.candidates)]
    checks += [("search.space", c) for c in study.space_checks()]
    for where, cand in checks:
        label = cand.label()
        try:
            launch = engine.command(settings_for(study, cand, port=engine.default_port or 8000))
            check_marker(naming.run_marker(naming.STUDY_MARKER_PREFIX, "preflight", label, 0))
            if launch.argv and any("\0" in a for a in launch.argv):
                raise ConfigError("the command line holds a NUL character")
        except UserError as exc:
            problems.append(
                f"  {where}: {label!r}: {exc.message}"
                + (f" ({exc.hint})" if exc.hint and exc.hint != exc.default_hint else "")
            )
        if len(problems) >= 20:
            break
    truncated = len(problems) >= 20
    problems += _unpriced(study)
    flags = check_study_flags(study, engine, host, reachable=reachable)
    problems += flags.problems
    if truncated or len(problems) > 20:
        problems = [*problems[:20], "  ... (the first 20 problems)"]
    if problems:
        raise ConfigError(
            "the study cannot be launched:\n" + "\n".join(problems),
            hint="fix the fields named above; `servelab tune STUDY --dry-run` checks the same",
        )
    return flags.notes()


def _unpriced(study: Study) -> list[str]:
    """A study ranked by cost on a GPU kind the catalog has no price for, and no price given: every level's
    cost would be missing and no candidate could win, so it is refused before anything runs. (A study that
    names no GPU kind is priced by the kind its trials detect; that is known only when they run.)"""
    names = [study.objective, *(study.search.objectives if study.search else [])]
    if not any(objective(n).needs_price for n in names) or study.cost.gpu_hour_usd is not None:
        return []
    gpu = study.host.gpu
    if not gpu or default_price(gpu) is not None:
        return []
    return [
        f"  cost.gpu_hour_usd: the study is ranked by cost and the catalog has no price per GPU-hour for "
        f"{gpu!r} (give the study [cost] gpu_hour_usd = PRICE, or `tune --gpu-hour-usd PRICE`)"
    ]
