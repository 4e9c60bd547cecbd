from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.bench import workload as W
from servelab.errors import ConfigError


def test_synthetic_is_seeded_and_unique() -> None:
    a = W.synthetic(20, W.LengthSpec(50), W.LengthSpec(10), seed=3)
    b = W.synthetic(20, W.LengthSpec(50), W.LengthSpec(10), seed=3)
    c = W.synthetic(20, W.LengthSpec(50), W.LengthSpec(10), seed=4)
    assert a.hash == b.hash != c.hash
    assert len({p.text.split(":")[0] for p in a.prompts}) == 20  # unique leading tags: no shared prefix


def test_length_ranges_stay_within_bounds() -> None:
    wl = W.synthetic(200, W.LengthSpec(100, 0.5), W.LengthSpec(100, 0.2), seed=1)
    outs = [p.output_len for p in wl.prompts]
    assert min(outs) >= 80 and max(outs) <= 120 and len(set(outs)) > 10


def test_usage_calibrated_word_counts() -> None:
    overhead, per_word = W.fit_tokens_per_word([(32, 32 * 1.3 + 9), (256, 256 * 1.3 + 9)])
    assert overhead == pytest.approx(9) and per_word == pytest.approx(1.3)
    wl = W.synthetic(5, W.LengthSpec(130), W.LengthSpec(10), seed=1, tokens_per_word=1.3)
    # "tag: " + 100 words
    assert all(len(p.text.split()) == 101 for p in wl.prompts)


def test_shared_prefix_prompts_share_prefixes() -> None:
    wl = W.shared_prefix(8, 2, 40, W.LengthSpec(10), W.LengthSpec(5), seed=0)
    heads = [p.text.split("\n")[0] for p in wl.prompts]
    assert len(set(heads)) == 2
    assert heads[0] == heads[2] == heads[4]


def test_sharegpt_reads_first_human_turn(tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "a b c"}, {"from": "gpt", "value": "d e f g"}]},
        {"conversations": [{"from": "gpt", "value": "orphan"}]},
        {"conversations": [{"from": "human", "value": "x y"}, {"from": "gpt", "value": "z"}]},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    wl = W.sharegpt(f, 4, seed=0)
    assert {p.text for p in wl.prompts} == {"a b c", "x y"}
    assert {(p.text, p.output_len) for p in wl.prompts} == {("a b c", 4), ("x y", 1)}


@pytest.mark.parametrize(
    "content,msg",
    [
        ("not json", "not valid JSON"),
        ('{"a": 1}', "must be a list"),
        ('[{"x": 1}]', "no 'conversations' list"),
        ('[{"conversations": []}]', "no usable"),
    ],
)
def test_bad_sharegpt_is_a_clear_error(tmp_path: Path, content: str, msg: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=msg):
        W.sharegpt(f, 4, seed=0)


def test_missing_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        W.TokenCounter(tmp_path)


def test_tokenizer_cuts_prompts_to_exact_length(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(set(W._WORDS))])}
    vocab |= {str(i): len(vocab) + i for i in range(10)} | {":": len(vocab) + 10, "-": len(vocab) + 11}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    counter = W.TokenCounter(tmp_path)
    wl = W.synthetic(10, W.LengthSpec(37), W.LengthSpec(5), seed=2, counter=counter)
    assert wl.token_counting == "tokenizer"
    assert [counter.count(p.text) for p in wl.prompts] == [37] * 10
