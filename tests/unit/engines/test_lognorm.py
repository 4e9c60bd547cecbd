"""`lognorm.normalise`: a mangled log reads like the clean one (each case is a format seen in a real issue,
tests/fixtures/logs/real/)."""

from __future__ import annotations

from pathlib import Path

from servelab.engines.lognorm import normalise
from servelab.engines.signatures import diagnose

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "real"

CLEAN = (
    "ERROR 06-19 07:06:13 [core.py:515] EngineCore failed to start.\n"
    "ERROR 06-19 07:06:13 [core.py:515] Traceback (most recent call last):\n"
)


def test_a_clean_log_is_left_as_it_is() -> None:
    assert normalise(CLEAN) == CLEAN
    assert normalise(normalise(CLEAN)) == CLEAN
    indented = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\nValueError: no\n'
    assert normalise(indented) == indented  # a traceback keeps its indentation


def test_ansi_codes_and_their_leftovers_go() -> None:
    real = "\x1b[36m(RayWorkerWrapper pid=4009)\x1b[0m INFO 02-03 13:14:04 done"
    lost = " [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog"
    start = "1;36m(VllmWorker rank=5 pid=33503) ERROR 03-06 06:49:30 [multiproc_executor.py:375] hit"
    assert normalise(real) == "INFO 02-03 13:14:04 done"
    assert normalise(lost) == " [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog"
    assert normalise(start) == "ERROR 03-06 06:49:30 [multiproc_executor.py:375] hit"
    # a bracket that is not a colour code stays
    assert (
        normalise("ERROR 11-29 [multiproc_executor.py:585] x") == "ERROR 11-29 [multiproc_executor.py:585] x"
    )


def test_collector_and_process_prefixes_go() -> None:
    cases = {
        # docker compose
        "llama-cpp    | ggml_cuda_init: failed to initialize CUDA: unknown error": (
            "ggml_cuda_init: failed to initialize CUDA: unknown error"
        ),
        # journald
        'Aug 19 18:34:27 vllm vllm[8727]: (EngineCore pid=8727)   File "a.py", line 2, in f': (
            '  File "a.py", line 2, in f'
        ),
        # nested process prefixes of vLLM V1
        "(APIServer pid=1) (EngineCore_DP6 pid=2454) (Worker_DP6_EP6 pid=2516) ERROR 10-30 17:32:00 [x.py:1] y": (
            "ERROR 10-30 17:32:00 [x.py:1] y"
        ),
        # Ray's prefix with an address
        "(ServeReplica:app:LLMDeployment pid=12249, ip=10.0.155.99) ERROR 01-01 00:00:00 [a.py:1] z": (
            "ERROR 01-01 00:00:00 [a.py:1] z"
        ),
        # container runtime timestamp, then torch's rank prefix stays (it is part of the record)
        "[2025-02-27T16:30:43.48675097Z] [rank3]:[E227 16:30:43.5 ProcessGroupNCCL.cpp:1785] w": (
            "[rank3]:[E227 16:30:43.5 ProcessGroupNCCL.cpp:1785] w"
        ),
        # compose + fastchat's own columns
        'qanything-container-local  | 2024-02-20 21:46:23 | ERROR | stderr |   File "w.py", line 71, in f': (
            '  File "w.py", line 71, in f'
        ),
        # markdown quote and inline code around a pasted line
        "> torch.cuda.OutOfMemoryError: CUDA out of memory.": "torch.cuda.OutOfMemoryError: CUDA out of memory.",
        "`vllm  | (EngineCore pid=81) WARNING 06-29 11:56:38 [u.py:209] no native FP4`": (
            "WARNING 06-29 11:56:38 [u.py:209] no native FP4"
        ),
        # a boxed terminal view padded to its width
        "│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error       │": (
            "ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error"
        ),
        # llama.cpp's pid in brackets
        "[56285] 0.54.236.075 E CUDA error: an illegal memory access was encountered   ": (
            "0.54.236.075 E CUDA error: an illegal memory access was encountered"
        ),
    }
    for raw, clean in cases.items():
        assert normalise(raw) == clean, raw


def test_a_line_that_lost_its_newlines_is_split_at_each_record() -> None:
    one_line = (
        "ERROR 11-04 18:02:56 [m.py:597] self.all_reduce(data) ERROR 11-04 18:02:56 [m.py:597] "
        'raise RuntimeError(f"NCCL error") ERROR 11-04 18:02:56 [m.py:597] RuntimeError: NCCL error: unhandled'
    )
    assert normalise(one_line).splitlines() == [
        "ERROR 11-04 18:02:56 [m.py:597] self.all_reduce(data)",
        'ERROR 11-04 18:02:56 [m.py:597] raise RuntimeError(f"NCCL error")',
        "ERROR 11-04 18:02:56 [m.py:597] RuntimeError: NCCL error: unhandled",
    ]
    sglang = "[2025-01-01 00:00:01 TP0] Load weight end. [2025-01-01 00:00:02 TP0] Memory pool end."
    assert normalise(sglang).splitlines() == [
        "[2025-01-01 00:00:01 TP0] Load weight end.",
        "[2025-01-01 00:00:02 TP0] Memory pool end.",
    ]


def test_a_hard_wrapped_line_is_joined() -> None:
    head = "ERROR 03-05 09:56:09 [core.py:1100] /usr/local/cuda/bin/nvcc -isystem /data/envs/vLLM_new/li"
    wrapped = head + "x" * (100 - len(head)) + "\nb/python3.11/site-packages/flashinfer/data/include\n"
    assert (
        normalise(wrapped)
        == head + "x" * (100 - len(head)) + "b/python3.11/site-packages/flashinfer/data/include\n"
    )
    # short lines, records, indented frames, exceptions and llama.cpp lines are never joined
    long = "I" * 120
    for line in (
        "ERROR 01-01 00:00:00 x",
        '  File "a.py", line 1, in f',
        "ValueError: bad",
        "llama_model_loader: x",
    ):
        assert normalise(f"{long}\n{line}").splitlines() == [long, line.rstrip()]
    assert normalise("short\nlowercase tail").splitlines() == ["short", "lowercase tail"]
    # a traceback frame's header is complete: the next line (its source, indentation lost) is not glued to it
    frame = 'File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 120, in decorate_context'
    assert normalise(f"{frame}\nreturn func(*args, **kwargs)").splitlines() == [
        frame,
        "return func(*args, **kwargs)",
    ]


def test_a_mangled_log_is_diagnosed_like_its_clean_self() -> None:
    clean = (
        "(EngineCore_DP0 pid=9) ERROR 01-08 11:19:33 [core.py:866] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=9) ERROR 01-08 11:19:33 [core.py:866] torch.AcceleratorError: CUDA error: "
        "an illegal memory access was encountered\n"
    )
    compose = "".join(f"vllm-1  | \x1b[33m{line}\x1b[0m\n" for line in clean.splitlines())
    one_line = clean.replace("\n", " ")
    want = diagnose(clean)
    assert want.klass == "illegal_memory_access"
    for mangled in (compose, one_line):
        got = diagnose(mangled)
        assert (got.klass, got.evidence) == (want.klass, want.evidence)


def test_every_real_excerpt_normalises_without_losing_its_words() -> None:
    for path in sorted(REAL.glob("*.log")):
        text = path.read_text()
        out = normalise(text)
        assert out == normalise(out), path.name  # a second pass changes nothing
        words = {w for w in text.split() if len(w) > 12 and w.isalnum()}
        assert all(w in out for w in words), path.name
