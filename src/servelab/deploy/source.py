"""RUN → the exact launch record behind a measured result (what ran, not what the study asked for).

RUN is one of:
- `STUDY` (uid, numeric id, name or `last`): the study's winner, its latest measured trial;
- `STUDY:CANDIDATE`: that candidate (its label), its latest measured trial;
- `trial:ID`: exactly that trial (it must have been measured).

The store redacts secrets (`***`) in argv and env, and a unit never holds one (ExecStart= is in `ps`,
Environment= in `systemctl show`): `apply_overrides` leaves every secret to the EnvironmentFile the user
supplies (`--env-file`) and refuses without one, or when a secret is given with `--env`/`--arg`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from servelab import load as load_kinds
from servelab.errors import ConfigError, NotFoundError
from servelab.jsontypes import JsonObject
from servelab.redact import MASK, env_route, has_url_credentials, is_secret_flag, is_secret_name, secret_args
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StoredStudy, StoredTrial, StudyRepo


@dataclass(frozen=True)
class LaunchRecord:
    """One measured trial: its exact command line and environment, and what it measured."""

    study_uid: str
    study_name: str
    candidate: str
    trial_id: int
    engine: str
    argv: list[str]
    env: dict[str, str]
    url: str
    served_model: str
    model_path: str
    engine_version: str | None
    ready_s: float | None
    # The stored documents it came from, as stored (open JSON: the store's, read here only where noted).
    levels: list[JsonObject] = field(default_factory=list)  # per-level digests of the trial
    main_level: float | None = None  # the study's level deployment checks use
    study: JsonObject = field(default_factory=dict)  # the stored study spec
    effective: JsonObject = field(default_factory=dict)
    candidate_spec: JsonObject = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()  # variables the deployment's EnvironmentFile must define (never inline)

    @property
    def ref(self) -> str:
        return f"{self.study_uid}:{self.candidate} (trial {self.trial_id})"

    @property
    def host(self) -> str:
        return flag_value(self.argv, "--host") or "127.0.0.1"

    @property
    def port(self) -> int:
        value = flag_value(self.argv, "--port")
        if value is None or not value.isdigit():
            raise ConfigError(
                f"the command line of {self.ref} has no --port", hint="pass --port PORT to deploy"
            )
        return int(value)

    def main_digest(self) -> JsonObject | None:
        """The measured digest at the main level (None: not measured at that level)."""
        for d in self.levels:
            level = d.get("level", -1)
            if (
                self.main_level is not None
                and isinstance(level, int | float | str)
                and float(level) == float(self.main_level)
            ):
                return d
        return None

    def to_dict(self) -> JsonObject:
        return {
            "study": self.study_uid,
            "study_name": self.study_name,
            "candidate": self.candidate,
            "trial": self.trial_id,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "argv": list(self.argv),
            "env": dict(self.env),
            "url": self.url,
            "served_model": self.served_model,
            "model_path": self.model_path,
            "ready_s": self.ready_s,
            "main_level": self.main_level,
        }


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag V` or `--flag=V`; the last one wins, as argparse does)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with every value of `flag` replaced; ConfigError when the flag is absent."""
    out, hit = list(argv), False
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1], hit = value, True
        elif arg.startswith(flag + "="):
            out[i], hit = f"{flag}={value}", True
    if not hit:
        raise ConfigError(
            f"the run's command line has no {flag} to replace",
            hint=f"the engine takes no {flag}; leave that override out",
        )
    return out


def resolve(store: Store, ref: str) -> LaunchRecord:
    """The launch record RUN names (see the module docstring)."""
    repo = StudyRepo(store)
    if ref.startswith("trial:"):
        tid = ref.removeprefix("trial:")
        if not tid.isdigit():
            raise ConfigError(f"{ref!r}: a trial is named trial:ID with a numeric id", hint="e.g. trial:12")
        return _from_trial(store, repo, int(tid))
    study_ref, _, label = ref.partition(":")
    study = repo.resolve(study_ref)
    cands = repo.candidates(study.id)
    if not label:
        ranking = r if isinstance(r := (study.result or {}).get("ranking"), dict) else {}
        label = w if isinstance(w := ranking.get("winner"), str) else ""
        if not label:
            raise NotFoundError(
                f"study {study.uid} has no winner (status {study.status})",
                hint=f"name a measured candidate: servelab deploy {study.uid}:LABEL "
                f"(candidates: {', '.join(c.label for c in cands) or 'none'})",
            )
    cand = next((c for c in cands if c.label == label), None)
    if cand is None:
        raise NotFoundError(
            f"study {study.uid} has no candidate {label!r}",
            hint=f"candidates: {', '.join(c.label for c in cands) or 'none'}",
        )
    measured = [t for t in repo.trials(cand.id) if t.status == "measured"]
    if not measured:
        raise NotFoundError(
            f"candidate {label!r} of study {study.uid} has no measured trial (status {cand.status})",
            hint="deploy a candidate that was measured; `servelab runs` shows each one's status",
        )
    return _record(study, cand, measured[-1])


def _from_trial(store: Store, repo: StudyRepo, tid: int) -> LaunchRecord:
    row = repo.trial_owner(tid)
    if row is None:
        raise NotFoundError(
            f"no trial {tid} in the store", hint="`servelab runs STUDY` lists the trials of a study"
        )
    study = repo.resolve(str(row[0]))
    cand = next(c for c in repo.candidates(study.id) if c.id == row[1])
    trial = next(t for t in repo.trials(cand.id) if t.id == tid)
    if trial.status != "measured":
        raise ConfigError(
            f"trial {tid} was not measured (status {trial.status}): nothing proves it works",
            hint="deploy a measured trial, or the candidate (STUDY:CANDIDATE)",
        )
    return _record(study, cand, trial)


def _record(study: StoredStudy, cand: StoredCandidate, trial: StoredTrial) -> LaunchRecord:
    spec = study.spec
    eff = e if isinstance(e := (trial.effective or {}).get("effective"), dict) else {}
    argv = [str(a) for a in trial.argv or []]
    if not argv:
        raise ConfigError(
            f"trial {trial.id} recorded no command line (an external endpoint?)",
            hint="servelab can only deploy a server it launched itself",
        )
    model = m if isinstance(m := spec.get("model"), dict) else {}
    served = (
        eff.get("served_model_name")
        or model.get("served_name")
        or flag_value(argv, "--served-model-name")
        or model.get("path")
        or ""
    )
    load, workload = spec.get("load"), spec.get("workload")
    kind = load_kinds.of_spec(
        load if isinstance(load, dict) else None, workload if isinstance(workload, dict) else None
    )
    return LaunchRecord(
        study_uid=study.uid,
        study_name=study.name,
        candidate=cand.label,
        trial_id=trial.id,
        engine=str(engine.get("name", "")) if isinstance(engine := spec.get("engine"), dict) else "",
        argv=argv,
        env={str(k): str(v) for k, v in (trial.env or {}).items()},
        url=trial.url or "",
        served_model=str(served),
        model_path=str(eff.get("model") or flag_value(argv, "--model") or model.get("path")),
        engine_version=trial.engine_version or (v if isinstance(v := eff.get("version"), str) else None),
        ready_s=trial.ready_s,
        levels=list(trial.levels or []),
        main_level=kind.main if kind is not None else None,
        study=spec,
        effective=eff,
        candidate_spec=cand.spec or {},
    )


SERVED_NAME_FLAGS = {"llamacpp": ("--alias", "-a")}  # every other engine: --served-model-name


def served_name_flags(engine: str) -> tuple[str, ...]:
    return SERVED_NAME_FLAGS.get(engine, ("--served-model-name",))


def default_port(record: LaunchRecord) -> int:
    """The port the engine serves on by default (vLLM 8000, SGLang 30000, llama.cpp 8080, ...): a study's
    trials run on a free port picked for the trial, which means nothing to the people calling the service.
    The simulator takes the default of the engine it imitates."""
    from servelab.engines import registry

    engine = record.engine
    if engine == "sim":
        personality = _table(_table(record.study.get("engine")).get("options")).get("personality")
        personality = personality or flag_value(record.argv, "--personality") or "vllm"
        return 8000 if personality == "vllm" else int(registry.get("sglang").default_port)
    return int(registry.get(engine).default_port)


def _table(value: object) -> JsonObject:
    """A stored table (a JSON object); {} for a missing one."""
    return value if isinstance(value, dict) else {}


def masked(record: LaunchRecord) -> tuple[list[str], list[str]]:
    """(env names, argv flags) whose stored values are redacted."""
    env = sorted(k for k, v in record.env.items() if MASK in v)
    flags = []
    for i, arg in enumerate(record.argv):
        if MASK in arg:
            flags.append(
                arg.split("=", 1)[0]
                if arg.startswith("--") and "=" in arg
                else (record.argv[i - 1] if i > 0 and record.argv[i - 1].startswith("-") else f"argv[{i}]")
            )
    return env, flags


def apply_overrides(
    record: LaunchRecord,
    env: dict[str, str] | None = None,
    args: dict[str, str] | None = None,
    port: int | None = None,
    env_file: bool = False,
) -> LaunchRecord:
    """The record with replaced flags and its serving port, and its secrets left to the EnvironmentFile;
    refuses while a secret would be written into the unit. The port is `port`, or the engine's default
    (`default_port`) — not the trial's.

    A secret never goes into the unit (its ExecStart= is in `ps`, its Environment= in `systemctl show`):
    secret flags leave the command line for the variable the engine reads them from (vLLM's --api-key:
    VLLM_API_KEY), secret-named or masked variables leave the environment, and the user's EnvironmentFile
    (`env_file`) must define them (`secret_env`). A secret given with --env/--arg is refused.

    The served name follows the command line: `--arg --served-model-name=X` (llama.cpp: `--alias`) changes
    what the server lists in /v1/models, so the readiness check asks for X; a served-name flag the run's
    command line lacks is added."""
    # Flags in backticks: `--api-key` followed by a word would read as a flag and its value, and be masked.
    inline = [f"`--env {n}`" for n in (env or {}) if is_secret_name(n)]
    inline += [
        f"`--env {n}`" for n, v in (env or {}).items() if has_url_credentials(v) and not is_secret_name(n)
    ]
    inline += [f"`--arg {f}`" for f, v in (args or {}).items() if is_secret_flag(f) or has_url_credentials(v)]
    if inline:
        raise ConfigError(
            f"{', '.join(inline)} would write a secret into the unit, where every user reads it",
            hint="put NAME=VALUE lines in a file of mode 0600 and pass --env-file FILE (a flag's value goes in "
            "the variable the engine reads it from, e.g. VLLM_API_KEY for vLLM's --api-key)",
        )
    argv, new_env = list(record.argv), dict(record.env)
    name_flags = served_name_flags(record.engine)
    served = record.served_model
    for flag, value in (args or {}).items():
        if flag in name_flags:
            served = value
            if all(flag_value(argv, f) is None for f in name_flags):
                argv += [flag, value]
                continue
            for f in name_flags:
                if flag_value(argv, f) is not None:
                    argv = set_flag(argv, f, value)
            continue
        argv = set_flag(argv, flag, value)
    argv = set_flag(argv, "--port", str(port if port is not None else default_port(record)))
    new_env.update(env or {})
    argv, from_flags = _secret_flags_to_env(record, argv)
    secret_env = sorted({*from_flags, *(k for k, v in new_env.items() if is_secret_name(k) or MASK in v)})
    rec = replace(
        record,
        argv=argv,
        env={k: v for k, v in new_env.items() if k not in secret_env},
        served_model=served,
        secret_env=tuple(secret_env),
    )
    _env_left, flags_left = masked(rec)
    if flags_left:
        raise ConfigError(
            f"the store keeps secrets redacted ('{MASK}'): argument {', '.join(f'`{f}`' for f in flags_left)} of {record.ref} "
            "cannot be deployed as stored, and a secret is never written into the unit",
            hint="drop the argument with --arg FLAG=VALUE (a value without a secret), or serve with an engine "
            "that reads it from its environment",
        )
    if secret_env and not env_file:
        raise ConfigError(
            f"{record.ref} runs with secrets ({', '.join(secret_env)}), and a secret is never written into the "
            "unit",
            hint=f"put {' '.join(f'{n}=VALUE' for n in secret_env)} in a file of mode 0600 and pass --env-file FILE",
        )
    return rec


def _secret_flags_to_env(record: LaunchRecord, argv: list[str]) -> tuple[list[str], list[str]]:
    """argv without its secret flags, and the variables the engine reads them from instead."""
    drop: set[int] = set()
    names: list[str] = []
    for i, flag, _value, inline in secret_args(argv):
        route = env_route(record.engine, flag)
        if route is None:
            raise ConfigError(
                f"{record.engine} takes `{flag}` only on its command line, and a secret is never written into "
                f"the unit ({record.ref})",
                hint=f"deploy it without `{flag}` (`--arg` cannot supply it: the value is a secret), or serve "
                "it behind a proxy that checks the key",
            )
        drop.update((i,) if inline else (i, i + 1))
        names.append(route)
    return [a for i, a in enumerate(argv) if i not in drop], names
