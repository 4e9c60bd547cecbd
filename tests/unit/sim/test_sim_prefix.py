"""The simulator's prefix cache: chained block hashes, LRU capacity, and what a hit does to a request."""

from __future__ import annotations

import pytest

from servelab.model.predict import make_setup
from servelab.sim.prefix import PrefixCache, block_hashes, output_tokens, prompt_tokens
from servelab.sim.scheduler import Limits, ListSink, Scheduler, SimRequest, Timing


def test_block_hashes_name_the_whole_prefix() -> None:
    a = [f"w{i}" for i in range(40)]
    b = ["other", *a[1:]]
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == 2  # full blocks only: the last 8 tokens make none
    assert ha[0] != hb[0] and ha[1] != hb[1]  # a change in block 0 changes every later hash
    assert block_hashes(a[:32], 16) == ha


def test_chat_tokens_carry_their_role() -> None:
    user = prompt_tokens([{"role": "user", "content": "a b c"}], chat=True)
    system = prompt_tokens([{"role": "system", "content": "a b c"}], chat=True)
    assert len(user) == 3 and user != system
    # the reply as the next turn resends it, an assistant message of the same words
    assert output_tokens([b" x", b" y"], chat=True) == prompt_tokens(
        [{"role": "assistant", "content": " x y"}], chat=True
    )
    assert output_tokens([b" x"], chat=False) == ["x"] and prompt_tokens("p q", chat=False) == ["p", "q"]


def test_lookup_counts_tokens_and_always_leaves_the_last_one() -> None:
    cache = PrefixCache(capacity_blocks=4, block_size=4)
    hashes = block_hashes([str(i) for i in range(8)], 4)
    assert cache.lookup(hashes, 8) == 0
    cache.insert(hashes)
    assert cache.lookup(hashes, 8) == 7  # all of it cached: its last token is computed again
    assert cache.lookup(hashes, 10) == 8
    assert (cache.queries, cache.hits) == (26, 15)
    assert cache.hit_rate == pytest.approx(15 / 26)


def test_capacity_evicts_the_least_recently_used() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=1)
    a, b, c = (block_hashes([x], 1) for x in "abc")
    cache.insert(a)
    cache.insert(b)
    cache.lookup(a, 2)  # a is used again: b is now the oldest
    cache.insert(c)
    assert len(cache) == 2
    assert cache.lookup(b, 2) == 0 and cache.lookup(a, 2) == 1 and cache.lookup(c, 2) == 1


def _run(sched: Scheduler, req: SimRequest, now: float) -> float:
    """Drive the scheduler until `req` finishes; returns the model time then."""
    sched.add(req, now)
    while req.state != 4:
        step = sched.plan(now)
        if step is None:
            now = sched.waiting[0].ready_at if sched.waiting else now
            continue
        sched.complete(step)
        now = step.start + step.dt
    return now


def test_a_hit_skips_prefill_and_brings_the_first_token_forward() -> None:
    timing = Timing(make_setup("Qwen3-8B", "h100-sxm", 1, engine="vllm"))
    sched = Scheduler(timing, Limits(kv_tokens=timing.mem.kv_cache_tokens, ttft_overhead_s=timing.overhead_s))
    sched.prefix = PrefixCache(sched.total_blocks, sched.bs)
    sched.record = True
    first = [f"t{i}" for i in range(4000)]
    turn1 = SimRequest(1, 4000, 8, "length", ListSink())
    full = block_hashes(first + [f"o{i}" for i in range(8)], 16)
    turn1.hashes, turn1.full_hashes = full[:250], full
    now = _run(sched, turn1, 0.0)
    # the next turn resends prompt + reply + 40 new tokens: all but the new tail is cached
    second = first + [f"o{i}" for i in range(8)] + [f"n{i}" for i in range(40)]
    turn2 = SimRequest(2, len(second), 8, "length", ListSink())
    turn2.hashes = block_hashes(second, 16)
    turn2.full_hashes = turn2.hashes
    start = now + 1.0
    _run(sched, turn2, start)
    assert turn2.cached == 4000  # 250 full blocks; the reply's tail block was not full
    assert turn2.need == 48  # the second prefill was only the rest
    assert sched.counters.prompt_tokens == 4000 + 4048  # counted whole, as vLLM counts prompt tokens
    assert turn1.token_times is not None and turn2.token_times is not None
    ttft1, ttft2 = turn1.token_times[0], turn2.token_times[0] - start
    assert ttft2 < 0.5 * ttft1
