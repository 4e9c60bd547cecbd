"""Hostile strings from logs (HTML, ANSI escapes, Markdown syntax) stay text in every output."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from servelab.report import data, html, markdown
from servelab.report.text import clean, h, md, md_code, md_inline_code
from servelab.store.db import Store


def test_clean_strips_csi_osc_and_controls() -> None:
    s = "\x1b[1;31mred\x1b[0m \x1b]0;title\x07x \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ a\x00b\x9b1mc\x07\tz\n"
    assert clean(s) == "red x link abc\tz\n"


def test_h_escapes_markup_and_quotes() -> None:
    assert h('<img src=x onerror="alert(1)">') == "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"
    assert h(None) == ""


def test_md_neutralises_html_tables_and_emphasis() -> None:
    out = md("<script>x</script> | *a* `b`\nnext")
    assert "<" not in out and "\n" not in out
    assert "\\|" in out and "\\*a\\*" in out and "\\`b\\`" in out


def test_md_code_fence_outlasts_backticks_inside() -> None:
    block = md_code("a ```` b")
    assert block.startswith("`````text\n") and block.endswith("\n`````")
    assert md_inline_code("a`b|c") == "``a`b\\|c``"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, d: str) -> None:
        self.text.append(d)


def test_html_report_shows_the_hostile_diagnosis_as_text(golden_store: Store) -> None:
    page = html.render(data.load(golden_store, "golden-study", model=False))
    assert "\x1b" not in page
    p = _Collect()
    p.feed(page)
    assert "script" not in p.tags and "b" not in p.tags  # neither the log's <script> nor the advice's <b>
    text = "".join(p.text)
    assert "<script>alert('x')</script> CUDA error | `rm -rf` **bold** & more" in text
    assert "check `nvidia-smi`; <b>reboot</b> if the driver is wedged" in text
    # nothing to fetch: no src/href to another origin (the SVG namespace is a name, not a request)
    assert not re.search(r"(?:src|href|url)\s*[=(]\s*[\"']?(?:https?:)?//", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_markdown_keeps_hostile_html_out_of_the_text(golden_store: Store) -> None:
    text = markdown.render(data.load(golden_store, "golden-study", model=False))
    assert "\x1b" not in text
    outside_code = re.sub(r"(`{3,})text\n.*?\n\1", "", text, flags=re.S)
    outside_code = re.sub(r"(`+)[^`].*?\1", "", outside_code)
    assert "<script" not in outside_code and "<b>" not in outside_code
    assert "&lt;b>reboot&lt;/b>" in text  # `<` as an entity opens no tag; `>` stays readable
