"""The simulated GPUs' power follows the model's step (sim/telemetry.py, data/sim/gpu_power.toml): each
part of a step draws the figure of what bounds it, the time between steps draws idle, and the collapse
keeps its own, lower figure. Steps are the scheduler's own, priced by the performance model; the windows
are read off its model-time clock, never the wall clock."""

from __future__ import annotations

from collections import deque

import pytest

from servelab.model.predict import make_setup
from servelab.sim.scheduler import Limits, Scheduler, Timing, Work
from servelab.sim.telemetry import draw, power, window
from servelab.sim.virtual import closed_loop


def _timing(model: str, gpu: str, tp: int) -> Timing:
    return Timing(make_setup(model, gpu, tp, tp=tp, engine="vllm"))


@pytest.fixture(scope="module")
def h100() -> Timing:
    return _timing("Qwen3-8B", "h100-sxm", 1)


def _busy(pw: dict[str, float], step: tuple[float, Work]) -> float:
    """Watts of a GPU busy with this step for the whole window."""
    dt, work = step
    assert work.busy_s == pytest.approx(dt)
    busy, watts = draw(pw, dt, work)
    assert busy == pytest.approx(1.0)
    return watts


def test_a_compute_bound_step_draws_more_than_a_memory_bound_one(h100: Timing) -> None:
    pw = power("h100-sxm")
    prefill = h100.prefill_alone(8192, 0)  # one long chunk: GEMMs over 8k tokens
    decode = h100.decode_step(1, 512)  # one token of one sequence: every weight read once
    assert prefill[1].compute_s > prefill[1].memory_s and decode[1].memory_s > decode[1].compute_s
    hot, cool = _busy(pw, prefill), _busy(pw, decode)
    assert pw["idle"] < cool < hot <= pw["limit"]
    # each part at its figure: a pure memory-bound second draws `active`, a pure compute-bound one `limit`
    assert draw(pw, 1.0, Work(memory_s=1.0))[1] == pytest.approx(pw["active"])
    assert draw(pw, 1.0, Work(compute_s=1.0))[1] == pytest.approx(pw["limit"])


def test_a_step_stalled_on_communication_draws_less() -> None:
    """Qwen3-8B decoding on RTX PRO 6000 over PCIe: on one GPU the step reads weights; split over eight,
    most of it waits on the all-reduce, and each GPU draws less."""
    pw = power("rtx-pro-6000")
    alone = _timing("Qwen3-8B", "rtx-pro-6000", 1).decode_step(16, 16 * 512)
    split = _timing("Qwen3-8B", "rtx-pro-6000", 8).decode_step(16, 16 * 512)
    assert alone[1].comm_s == 0 and split[1].comm_s > split[1].memory_s
    assert pw["collapse"] < _busy(pw, split) < _busy(pw, alone) <= pw["active"]
    waiting = pw["idle"] + pw["comm_share"] * (pw["active"] - pw["idle"])
    assert draw(pw, 1.0, Work(comm_s=1.0))[1] == pytest.approx(waiting)


def test_between_steps_the_gpus_draw_idle(h100: Timing) -> None:
    """A closed loop of one stream keeps the GPU busy back to back; a window twice as long holds that work
    and as much idle time (halfway between idle and the busy draw), and a window after it only idle."""
    pw = power("h100-sxm")
    sched = Scheduler(h100, Limits(kv_tokens=h100.mem.kv_cache_tokens, ttft_overhead_s=h100.overhead_s))
    closed_loop(sched, 1, 2, 256, 256)
    work, end = sched.counters.work, sched.t_end
    assert work.busy_s == pytest.approx(sched.counters.busy_s) and 0.5 < end <= 4.0
    busy_w = draw(pw, work.busy_s, work)[1]
    samples: deque[tuple[float, Work]] = deque([(0.0, Work())])
    span, done = window(samples, 2 * end, work)
    assert (span, done) == (2 * end, work)
    util, watts = draw(pw, span, done)
    assert util == pytest.approx(work.busy_s / (2 * end))
    assert watts == pytest.approx(pw["idle"] + (busy_w - pw["idle"]) * util)
    assert pw["idle"] < watts < busy_w
    span, done = window(samples, 4 * end, work)  # the window starts at 2 × end: nothing ran since
    assert span == pytest.approx(2 * end) and done.busy_s == 0
    assert draw(pw, span, done) == (0.0, pw["idle"])


def test_the_collapse_keeps_its_power_drop() -> None:
    """The allreduce-fusion collapse (the scheduler's 8× slowdown) draws the measured `collapse` figure for
    all its busy time: below what the same step draws unharmed."""
    pw = power("rtx-pro-6000")
    setup = make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8, engine="sglang")
    healthy, collapsed = (
        Timing(setup).decode_step(16, 16 * 2048),
        Timing(setup, slowdown=8.0).decode_step(16, 16 * 2048),
    )
    assert collapsed[0] == pytest.approx(8 * healthy[0])
    dt, work = collapsed
    assert draw(pw, dt, work, collapse=True) == (pytest.approx(1.0), pytest.approx(pw["collapse"]))
    assert pw["collapse"] < 0.6 * _busy(pw, healthy)  # the study's power_drop_ratio default flags it
