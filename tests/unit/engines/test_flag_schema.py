"""Flag schemas: the simulator personalities' parsers, llama.cpp's `--help` and SGLang's argparse usage
(real captures in tests/fixtures/flags, each with its source; neither engine is installed for the tests),
and the check a study's args go through before anything launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.engines import registry
from servelab.engines.flagschema import check_args, parse_dump, parse_help, parse_usage
from servelab.host.flagschema import flag_source
from servelab.sim.personalities import flag_schema

FLAGS = Path(__file__).resolve().parents[2] / "fixtures" / "flags"


def fixture(name: str) -> str:
    lines = (FLAGS / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("# "):  # the provenance header
        lines.pop(0)
    return "".join(lines)


def messages(args: list[str], schema_sets: tuple[str, ...] = (), *, personality: str = "vllm") -> list[str]:
    return [p.message for p in check_args(args, flag_schema(personality), schema_sets)]


VLLM_SETS = tuple(flag_source(registry.get("vllm")).sets)  # type: ignore[union-attr]


def test_sim_vllm_personality_schema_is_its_parser() -> None:
    s = flag_schema("vllm")
    assert s.engine == "sim" and s.version == "vllm 0.11.0"
    assert s.lookup("-tp") is s.lookup("--tensor-parallel-size")
    assert s.lookup("--no-enable-prefix-caching") is s.lookup("--enable-prefix-caching")
    assert s.lookup("--max-num-seqs").kind == "int"  # type: ignore[union-attr]
    assert s.lookup("--enforce-eager").takes_value is False  # type: ignore[union-attr]
    # what the personality parses, the check accepts
    assert messages(["--enforce-eager", "--max-num-seqs", "8", "--no-enable-prefix-caching"]) == []


def test_sim_flags_refused_with_the_closest_spelling_choice_and_type() -> None:
    assert messages(["--max-num-seqz", "8"]) == [
        "--max-num-seqz: sim vllm 0.11.0 has no such flag (did you mean --max-num-seqs?)"
    ]
    assert messages(["--max-num-seqs", "eight"]) == ["--max-num-seqs expects an integer, not 'eight'"]
    assert messages(["--gpu-memory-utilization=most"]) == [
        "--gpu-memory-utilization expects a number, not 'most'"
    ]
    bad = messages(["--moe-runner-backend", "flashinfer_cutlas"], personality="sglang")
    assert (
        len(bad) == 1 and "not one of its choices" in bad[0] and "did you mean 'flashinfer_cutlass'" in bad[0]
    )
    # argparse would take an abbreviation; servelab reads flags by name, so it asks for the full one
    assert messages(["--max-num-s", "8"]) == [
        "--max-num-s abbreviates --max-num-seqs: spell it in full (servelab reads flags by name)"
    ]
    assert messages(["--enforce-eager=yes"]) == ["--enforce-eager is a switch and takes no value (got 'yes')"]
    assert messages(["--max-num-seqs"]) == ["--max-num-seqs needs a value"]


def test_flags_servelab_sets_are_refused_under_every_alias() -> None:
    for args in (["--port", "9000"], ["--host=0.0.0.0"], ["--served-model-name", "x"], ["--model", "m"]):
        [msg] = messages(args, VLLM_SETS)
        assert "servelab sets it for every launch" in msg, msg
    assert messages(["--port", "9000"]) == []  # only the adapter's own list makes them servelab's


def test_llama_server_help_parsed_from_the_real_text() -> None:
    s = parse_help(fixture("llama-server-help.txt"), "llamacpp", "2025-10", "llama-server --help")
    assert len(s.flags) > 150
    ctk = s.lookup("-ctk")
    assert ctk is s.lookup("--cache-type-k") and ctk is not None
    assert ctk.choices == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    fa = s.lookup("--flash-attn")
    assert fa is not None and fa.choices == ("on", "off", "auto")
    assert s.lookup("--rope-scaling").choices == ("none", "linear", "yarn")  # type: ignore[union-attr]
    assert s.lookup("--kv-unified").takes_value is False  # type: ignore[union-attr]
    assert s.lookup("--lora-scaled").nargs == "2"  # type: ignore[union-attr]  # FNAME SCALE
    assert s.lookup("--override-tensor") is s.lookup("-ot")  # placeholder with spaces, help on the next line
    assert s.lookup("--defrag-thold").status == "deprecated"  # type: ignore[union-attr]
    sets = tuple(flag_source(registry.get("llamacpp")).sets)  # type: ignore[union-attr]
    got = [
        p.message
        for p in check_args(
            ["--ctx-sise", "4096", "-fa", "maybe", "-c", "big", "-dt", "0.1", "--alias", "x", "--no-mmap"],
            s,
            sets,
        )
    ]
    assert got[0] == "--ctx-sise: llamacpp 2025-10 has no such flag (did you mean --ctx-size?)"
    assert got[1] == "-fa 'maybe' is not one of its choices: on, off, auto"
    assert got[2] == "-c expects a number, not 'big'"
    assert got[3].startswith("-dt: llamacpp 2025-10 marks it deprecated: KV cache defragmentation threshold")
    assert "servelab sets it" in got[4] and len(got) == 5


def test_sglang_usage_parsed_from_the_real_message() -> None:
    s = parse_usage(fixture("sglang-0.5.8.post1-usage.txt"), "sglang", "0.5.8.post1", "usage")
    assert len(s.flags) > 300
    mp = s.lookup("--model-path")  # the one required option, outside brackets
    assert mp is not None and mp.takes_value
    assert s.lookup("--skip-tokenizer-init").takes_value is False  # type: ignore[union-attr]
    assert s.lookup("--model-checksum").nargs == "?"  # type: ignore[union-attr]
    assert s.lookup("--log-requests-target").nargs == "+"  # type: ignore[union-attr]
    moe = s.lookup("--moe-runner-backend")
    assert moe is not None and "flashinfer_cutlass" in (moe.choices or ())
    got = [
        p.message
        for p in check_args(
            [
                "--moe-runner-backend",
                "flashinfer_cutlas",
                "--tensor-paralel-size",
                "2",
                "--disable-radix-cache",
            ],
            s,
        )
    ]
    assert len(got) == 2
    assert "not one of its choices" in got[0] and "did you mean 'flashinfer_cutlass'" in got[0]
    assert (
        got[1]
        == "--tensor-paralel-size: sglang 0.5.8.post1 has no such flag (did you mean --tensor-parallel-size?)"
    )


def test_schema_round_trips_through_its_cache_text() -> None:
    s = flag_schema("sglang")
    again = parse_dump(s.to_json())
    assert again == s and again.lookup("--tp") is again.lookup("--tp-size")


@pytest.mark.parametrize("text", ["", "{}", '{"engine": "x"}', "not json"])
def test_a_broken_cache_text_is_not_a_schema(text: str) -> None:
    from servelab.engines.flagschema import SchemaError

    with pytest.raises(SchemaError):
        parse_dump(text)
