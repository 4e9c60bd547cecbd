"""Trace readers on the sample files (tests/fixtures/traces, written by tests/support/trace_samples.py in
each published format), their errors on bad files, and the prompts that replay a trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.support import trace_samples

from servelab.bench import traces as T
from servelab.bench import workload as W
from servelab.bench.config import BenchConfig
from servelab.errors import ConfigError

SAMPLES = trace_samples.DIR


def test_the_committed_samples_are_what_the_generator_writes() -> None:
    for name, make in trace_samples.SAMPLES.items():
        assert (SAMPLES / name).read_text() == make(), f"{name}: run python -m tests.support.trace_samples"


def test_every_format_has_its_source_and_fields_in_the_data_file() -> None:
    fmts = T.formats()
    assert set(fmts) == {"mooncake", "burstgpt", "azure"}
    assert fmts["mooncake"].block_tokens == 512 and fmts["mooncake"].hash_ids == "hash_ids"
    assert fmts["mooncake"].unit == "ms" and fmts["burstgpt"].unit == "s" and fmts["azure"].unit == "datetime"
    assert "github.com/kvcache-ai/Mooncake" in fmts["mooncake"].source
    assert "github.com/HPMLL/BurstGPT" in fmts["burstgpt"].source
    assert "github.com/Azure/AzurePublicDataset" in fmts["azure"].source
    for f in fmts.values():
        assert {f.timestamp, f.input, f.output} <= set(f.columns)


def test_mooncake_sample() -> None:
    t = T.read_trace(SAMPLES / "mooncake.jsonl", "mooncake")
    rows = [json.loads(x) for x in (SAMPLES / "mooncake.jsonl").read_text().splitlines()]
    assert (t.format, len(t.requests), t.skipped, t.block_tokens) == ("mooncake", 100, 0, 512)
    assert [r.offset_s for r in t.requests] == [(x["timestamp"] - rows[0]["timestamp"]) / 1000 for x in rows]
    assert [r.input_len for r in t.requests] == [x["input_length"] for x in rows]
    assert [r.output_len for r in t.requests] == [x["output_length"] for x in rows]
    assert [list(r.hash_ids) for r in t.requests] == [x["hash_ids"] for x in rows]
    assert T.describe(t)["shared_blocks"] > 50  # the sample reuses its prefixes


def test_burstgpt_sample_skips_failed_rows() -> None:
    t = T.read_trace(SAMPLES / "burstgpt.csv", "burstgpt")
    assert (len(t.requests), t.skipped) == (97, 3)  # three rows with 0 response tokens
    assert t.requests[0] == T.TraceRequest(0.0, 192, 21)
    assert t.requests[1].offset_s == pytest.approx(0.213)
    assert all(r.hash_ids == () and r.output_len > 0 for r in t.requests)


def test_azure_sample_keeps_100ns_ticks() -> None:
    t = T.read_trace(SAMPLES / "azure.csv", "azure")
    assert len(t.requests) == 100 and t.requests[0].offset_s == 0.0
    # 18:15:47.0285505 − 18:15:46.6805900: seven fraction digits, one more than datetime keeps
    assert t.requests[1].offset_s == pytest.approx(0.3479605, abs=1e-7)
    assert (t.requests[0].input_len, t.requests[0].output_len) == (1324, 48)
    assert t.span_s == pytest.approx(10.0, abs=1e-6)


@pytest.mark.parametrize(
    "name,fmt", [("mooncake.jsonl", "mooncake"), ("burstgpt.csv", "burstgpt"), ("azure.csv", "azure")]
)
def test_format_is_told_from_the_first_line(name: str, fmt: str) -> None:
    assert T.detect_format(SAMPLES / name) == fmt
    assert T.read_trace(SAMPLES / name).format == fmt


def test_unsorted_rows_are_replayed_in_arrival_order(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("Timestamp,Request tokens,Response tokens\n5,10,1\n2,20,2\n2,30,3\n")
    t = T.read_trace(f, "burstgpt")
    assert [(r.offset_s, r.input_len) for r in t.requests] == [(0.0, 20), (0.0, 30), (3.0, 10)]


def test_slices() -> None:
    t = T.read_trace(SAMPLES / "mooncake.jsonl")
    assert len(t.sliced(limit=7).requests) == 7
    cut = t.sliced(until_s=2.0)
    assert cut.requests and all(r.offset_s < 2.0 for r in cut.requests)
    assert len(cut.requests) == sum(r.offset_s < 2.0 for r in t.requests)
    assert cut.total == 100


@pytest.mark.parametrize(
    "fmt,content,msg",
    [
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1}\n',
            r"line 2: 'input_length' is missing",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\nnot json\n',
            r"line 2: not JSON",
        ),
        ("mooncake", "[1, 2]\n", r"line 1: a JSON object is expected"),
        (
            "mooncake",
            '{"timestamp": "x", "input_length": 5, "output_length": 2}\n',
            r"line 1: 'timestamp' must be a number",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": -5, "output_length": 2}\n',
            r"'input_length' must be a whole number",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5.5, "output_length": 2}\n',
            r"'input_length' must be a whole number",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1, "a"]}\n',
            r"'hash_ids' must be a list",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 99999999, "output_length": 2}\n',
            r"longer than any model",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 0}\n',
            r"no request to replay \(all 1 rows",
        ),
        (
            "burstgpt",
            "Timestamp,Model,Request tokens\n1,ChatGPT,5\n",
            r"line 1: the header lacks column\(s\) 'Response tokens'",
        ),
        (
            "burstgpt",
            "Timestamp,Request tokens,Response tokens\n1,5,2\n2,five,2\n",
            r"line 3: 'Request tokens' must be a number",
        ),
        (
            "burstgpt",
            "Timestamp,Request tokens,Response tokens\n1,5,2\n2,,2\n",
            r"line 3: 'Request tokens' is missing",
        ),
        (
            "burstgpt",
            "Timestamp,Request tokens,Response tokens\n1,5,nan\n",
            r"line 2: 'Response tokens' must be a finite",
        ),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,2\n",
            r"line 2: 'TIMESTAMP' must be a date and time",
        ),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n", r"no request to replay"),
    ],
)
def test_bad_files_name_the_file_line_and_field(tmp_path: Path, fmt: str, content: str, msg: str) -> None:
    f = tmp_path / "bad.trace"
    f.write_text(content)
    with pytest.raises(ConfigError, match=msg) as err:
        T.read_trace(f, fmt)
    assert str(f) in err.value.message and err.value.hint and fmt in err.value.hint


def test_missing_empty_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        T.read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        T.read_trace(tmp_path / "empty.csv")
    (tmp_path / "odd.csv").write_text("when,in,out\n1,2,3\n")
    with pytest.raises(ConfigError, match="cannot tell its format") as err:
        T.read_trace(tmp_path / "odd.csv")
    assert "--trace-format" in (err.value.hint or "")


def test_shared_hash_ids_share_their_exact_text() -> None:
    t = T.read_trace(SAMPLES / "mooncake.jsonl")
    prompts = list(T.trace_prompts(t, seed=7))
    block_words = 512  # tokens_per_word 1: a block is 512 words
    by_prefix: dict[tuple[int, ...], list[str]] = {}
    for r, p in zip(t.requests, prompts, strict=True):
        words = p.text.split(" ")
        assert len(words) == r.input_len == p.input_len  # all blocks, no tail: one word a token
        for k in range(len(r.hash_ids) - 1):  # every full block
            by_prefix.setdefault(r.hash_ids[: k + 1], []).append(
                " ".join(words[k * block_words : (k + 1) * block_words])
            )
    shared = {k: v for k, v in by_prefix.items() if len(v) > 1}
    assert shared and all(len(set(v)) == 1 for v in shared.values())  # same ids, same text
    firsts = {v[0] for k, v in by_prefix.items() if len(k) == 1}
    assert len(firsts) == len({k for k in by_prefix if len(k) == 1})  # different ids, different text
    again = list(T.trace_prompts(t, seed=7))
    other = list(T.trace_prompts(t, seed=8))
    assert again == prompts and other[0].text != prompts[0].text


def test_tokens_past_the_blocks_are_the_requests_own(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 600, "output_length": 3, "hash_ids": [1]} for i in range(3)]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = list(T.trace_prompts(T.read_trace(f), seed=0, tokens_per_word=2.0, overhead=10))
    heads = {p.text.split(" ")[:256] == prompts[0].text.split(" ")[:256] for p in prompts}
    assert heads == {True}  # one shared block: 512 tokens at 2 per word
    tails = [" ".join(p.text.split(" ")[256:]) for p in prompts]
    assert len(set(tails)) == 3 and tails[0].startswith("0-0: ")
    assert all(len(t.split()) * 2 == 590 - 512 for t in tails)  # the tag is one of the tail's words
    assert [p.input_len for p in prompts] == [590] * 3  # less the server's template overhead


def test_a_trace_without_hash_ids_has_no_shared_prefix() -> None:
    t = T.read_trace(SAMPLES / "azure.csv")
    prompts = list(T.trace_prompts(t, seed=0))
    assert len({p.text.split(":")[0] for p in prompts}) == len(prompts)
    assert [p.output_len for p in prompts] == [r.output_len for r in t.requests]
    # one word a token (the simulator's count): the tag is one of the request's words
    assert [len(p.text.split()) for p in prompts] == [r.input_len for r in t.requests]


def _word_tokenizer(tmp_path: Path) -> W.TokenCounter:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(set(W._WORDS))])}
    vocab |= {str(i): len(vocab) + i for i in range(10)} | {":": len(vocab) + 10, "-": len(vocab) + 11}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    return W.TokenCounter(tmp_path)


def test_with_a_tokenizer_lengths_are_exact(tmp_path: Path) -> None:
    counter = _word_tokenizer(tmp_path)
    for name in ("mooncake.jsonl", "burstgpt.csv"):
        t = T.read_trace(SAMPLES / name).sliced(limit=20)
        prompts = list(T.trace_prompts(t, seed=1, counter=counter))
        assert [counter.count(p.text) for p in prompts] == [r.input_len for r in t.requests]
        assert [p.input_len for p in prompts] == [r.input_len for r in t.requests]


def test_bench_config_trace_options() -> None:
    base = {"url": "http://x", "model": "m", "levels": [2.0], "mode": "trace"}
    cfg = BenchConfig(**base, trace="t.jsonl", time_scale=2.0)
    t = T.read_trace(SAMPLES / "mooncake.jsonl").sliced(limit=5)
    (spec,) = cfg.level_specs(t)
    assert spec.mode == "trace" and spec.label == "trace mooncake ×2"
    assert spec.offsets == tuple(r.offset_s / 2 for r in t.requests) and spec.num_requests == 5
    for bad, msg in (
        ({"num_requests": 5}, "--trace-limit"),
        ({"workload": "sharegpt", "dataset": "x"}, "its own workload"),
        ({"time_scale": 0}, "greater than 0"),
        ({"trace_format": "nope"}, "must be one of"),
    ):
        with pytest.raises(ValidationError, match=msg):
            BenchConfig(**base | {"trace": "t.jsonl"} | bad)
    with pytest.raises(ValidationError, match="need --trace"):
        BenchConfig(url="http://x", model="m", levels=[1.0], num_requests=1, time_scale=2.0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", "bench", "--url", "http://127.0.0.1:9", "--model", "m", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_trace_is_exit_2_before_any_server_is_asked(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1}\n')
    p = _cli("--trace", str(f), "--trace-format", "mooncake")  # nothing listens on port 9
    assert p.returncode == 2, p.stderr
    assert f"trace {f} line 2: 'input_length' is missing" in p.stderr and "Traceback" not in p.stderr
    p = _cli("--trace", str(f), "--rate", "2", "--num-requests", "3")
    assert p.returncode == 2 and "exactly one of --concurrency or --rate, or --trace" in p.stderr
    p = _cli("--trace", str(SAMPLES / "azure.csv"), "--num-requests", "3")
    assert p.returncode == 2 and "--trace-limit" in p.stderr
