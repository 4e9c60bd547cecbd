"""One real study made by `servelab tune` against the simulator, shared by the report's and deploy's tests:
GLM-5 NVFP4 on eight simulated RTX PRO 6000 (SGLang personality), two candidates — TP8 and the allreduce-fusion
flag whose throughput collapses — two repeats each (so the digests carry confidence intervals), levels 1, 16 and 256 of 2,048-token prompts (TTFT spans decades),
served as `glm-5`. Made once per session (a file lock lets every conftest that asks share the one study)."""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.shared import shared_dir

SERVED = "glm-5"
CANDIDATES = [
    {"name": "tp8", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_cutlass"], "baseline": True},
    {
        "name": "tp8-arfusion-with-a-long-label",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass", "--enable-flashinfer-allreduce-fusion"],
    },
]


@dataclass(frozen=True)
class SimStudy:
    home: Path
    uid: str
    result: dict[str, Any]


def make(root: Path) -> SimStudy:
    from tests.integration.test_tune_sim import servelab, write_study

    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "study.json"
        if not done.exists():
            path = write_study(
                root / "study.toml",
                "glm5-shared",
                CANDIDATES,
                model="GLM-5-NVFP4",
                gpu="rtx-pro-6000",
                num_gpus=8,
                personality="sglang",
                levels=[1, 16, 256],
                speed=20,
                extra_engine={"args": ["--disable-radix-cache"]},
                top='objective = "output_throughput"\nrepeats = 2\n[slo]\ntpot_ms = { p50 = 150 }',
            )
            text = path.read_text().replace("[model]\n", f'[model]\nserved_name = "{SERVED}"\n', 1)
            text = text.replace("input_len = 256\n", "input_len = 2048\n", 1)  # TTFT spans decades by 256
            path.write_text(text)
            out = servelab("tune", str(path), "--json", home=root / "home", timeout=900)
            done.write_text(out.stdout)
        result = json.loads(done.read_text())
    return SimStudy(home=root / "home", uid=result["study"], result=result)


@pytest.fixture(scope="session")
def sim_study(tmp_path_factory: pytest.TempPathFactory) -> SimStudy:
    return make(shared_dir(tmp_path_factory, "shared-sim-study"))
