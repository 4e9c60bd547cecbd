"""A study's engine flags checked against the engine installed where its candidates will run, before
anything launches (the preflight of the dry run and of the real run).

Each distinct engine installation (engine, interpreter or binary, simulator personality) is read once
(`host.flagschema`, cached per engine and version); `engine.args` is checked once per installation, each
candidate's own `args` under its field path. An installation that cannot be read here (the engine is not
installed on this machine, a Ray cluster's nodes) is named in a note: its flags are left to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.config.study import Study
from servelab.engines.base import Engine
from servelab.engines.flagschema import check_args
from servelab.host import transport
from servelab.host.flagschema import SchemaRead, flag_source, read_key, read_schema
from servelab.trial.prepare import settings_for


@dataclass
class FlagCheck:
    """What the check found: the problems (field path, label, message) and one read per installation."""

    problems: list[str] = field(default_factory=list)
    reads: list[SchemaRead] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One line per installation: where its schema came from, or why the flags were not checked."""
        out = []
        for r in self.reads:
            if r.schema is not None:
                out.append(
                    f"flags checked against {r.schema.engine} {r.schema.version} ({r.where}, {r.note}: "
                    f"{len(r.schema.flags)} flags)"
                )
            else:
                out.append(f"flags not checked for {r.engine} ({r.where}): {r.note}")
        return out


def check_study_flags(
    study: Study, engine: Engine, host: transport.Host | None = None, *, reachable: bool = True
) -> FlagCheck:
    """Every candidate's engine flags against the installed engine's schema. `host`: where the candidates
    launch (None: this machine); `reachable` False (a Ray cluster's nodes) leaves installed engines unread
    (the simulator's schema is servelab's own and is still checked)."""
    out = FlagCheck()
    src = flag_source(engine)
    if src is None:
        return out
    reads: dict[tuple[str, ...], SchemaRead] = {}
    checked_engine_args: set[tuple[str, ...]] = set()
    checked: dict[tuple[str, ...], list[str]] = {}
    cands = [(f"{study.where(i)}.args", c) for i, c in enumerate(study.candidates)]
    cands += [("search.space.args", c) for c in study.space_checks()]
    for where, cand in cands:
        s = settings_for(study, cand)
        key = read_key(engine, s)
        if key not in reads:
            if src.kind != "sim" and not reachable:
                reads[key] = SchemaRead(
                    engine.name, None, "cluster", "read on the nodes is not supported yet"
                )
            else:
                reads[key] = read_schema(engine, s, host)
            out.reads.append(reads[key])
        read = reads[key]
        if read.schema is None:
            continue
        label = cand.label()
        if key not in checked_engine_args:
            checked_engine_args.add(key)
            for p in check_args(study.engine.args, read.schema, read.sets):
                out.problems.append(f"  engine.args: {p.message}")
        memo = (*key, "\0", *cand.args)  # a matrix repeats few distinct args
        if memo not in checked:
            checked[memo] = [p.message for p in check_args(cand.args, read.schema, read.sets)]
        out.problems += [f"  {where}: {label!r}: {m}" for m in checked[memo]]
    return out
