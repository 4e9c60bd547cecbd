"""`servelab ui` over real HTTP on a free port: pages, JSON, 405 for writes, 404s, live progress."""

from __future__ import annotations

import html
import json
import re
import types
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import SimBenchRuns
from tests.support.simruns import copy_store
from tests.unit.report.study_builder import GOLDEN_UID, build_study

from servelab.results import Run
from servelab.store.bench import BenchRepo
from servelab.store.copy import copy_store as copy_rows
from servelab.store.db import open_store
from servelab.ui.server import is_loopback, make_server, serve_in_thread, url_of


@pytest.fixture
def served(tmp_path: Path, sim_bench_home: SimBenchRuns) -> Iterator[tuple[str, list[str]]]:
    """The UI over a store holding a golden study and two runs the real `servelab bench` wrote against a
    live simulator."""
    home = tmp_path / "ui-home"
    copy_store(sim_bench_home.home, home)
    db = home / "servelab.db"
    with open_store(db) as store:
        build_study(store, tmp_path)
    server = make_server("127.0.0.1", 0, db)
    serve_in_thread(server)
    try:
        yield url_of(server), list(sim_bench_home.runs)
    finally:
        server.shutdown()
        server.server_close()


def _shown(db_home: Path, uid: str) -> Run:
    with open_store(db_home / "servelab.db") as store:
        return BenchRepo(store).load(uid)


def get(url: str) -> tuple[int, str, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def test_pages_show_studies_runs_and_comparisons(served: tuple[str, list[str]], tmp_path: Path) -> None:
    base, (a, b) = served
    home = tmp_path / "ui-home"
    status, body, headers = get(base)
    assert status == 200 and f'href="/study/{GOLDEN_UID}"' in body and "golden-study" in body
    assert "default-src 'none'" in body and headers["X-Frame-Options"] == "DENY"
    status, body, _ = get(f"{base}study/{GOLDEN_UID}")
    assert status == 200 and 'data-candidate="tp8"' in body and 'id="fig-throughput"' in body
    assert 'data-value="503.0"' in body
    run_a, run_b = _shown(home, a), _shown(home, b)
    status, body, _ = get(f"{base}run/{a}")
    thr = run_a.levels[1].summary.output_throughput  # as `runs show` shows it: simulated GPU time
    assert status == 200 and f'data-value="{thr!r}"' in body and "Simulated GPU time" in body
    status, body, _ = get(f"{base}compare?a={a}&b={b}")
    ta, tb = run_a.levels[0].summary.output_throughput, run_b.levels[0].summary.output_throughput
    assert status == 200 and f"{(tb - ta) / ta * 100:+.1f} %" in body
    assert body.count('class="levels"') == 2
    status, body, _ = get(f"{base}plan/{GOLDEN_UID}")
    assert status == 200 and "Plan" in body


def test_json_endpoints(served: tuple[str, list[str]], tmp_path: Path) -> None:
    base, (a, _b) = served
    assert json.loads(get(f"{base}api/studies")[1])["studies"][0]["winner"] == "tp8"
    model = json.loads(get(f"{base}api/study/{GOLDEN_UID}")[1])
    assert model["winner"]["label"] == "tp8"
    prog = json.loads(get(f"{base}api/study/{GOLDEN_UID}/progress")[1])
    assert prog["status"] == "completed" and prog["finished"] == 5 and prog["total"] == 6
    thr = _shown(tmp_path / "ui-home", a).levels[1].summary.output_throughput
    assert json.loads(get(f"{base}api/run/{a}")[1])["levels"][1]["output_throughput"] == pytest.approx(thr)


def test_missing_things_are_404(served: tuple[str, list[str]]) -> None:
    base, _ = served
    status, body, _ = get(f"{base}study/nope")
    assert status == 404 and "no study" in body
    assert get(f"{base}api/run/nope")[0] == 404
    assert get(f"{base}nothing/here")[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_writes_are_refused(served: tuple[str, list[str]], method: str) -> None:
    base, _ = served
    req = urllib.request.Request(f"{base}study/{GOLDEN_UID}", data=b"x", method=method)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 405 and exc.value.headers["Allow"] == "GET, HEAD"


def test_running_study_page_polls_its_progress(served: tuple[str, list[str]], tmp_path: Path) -> None:
    base, _ = served
    with open_store(tmp_path / "ui-home" / "servelab.db") as store:
        store.conn.execute("UPDATE studies SET status = 'running'")
    status, body, _ = get(f"{base}study/{GOLDEN_UID}")
    assert status == 200 and f'data-url="/api/study/{GOLDEN_UID}/progress"' in body and "fetch(" in body


def test_the_same_pages_from_a_postgresql_copy(
    served: tuple[str, list[str]], pg_url: str, tmp_path: Path
) -> None:
    """The store copied into PostgreSQL (`servelab db copy`'s code) serves the very same pages, read-only."""
    base, (a, b) = served
    with open_store(tmp_path / "ui-home" / "servelab.db") as src, open_store(pg_url) as dst:
        copy_rows(src, dst)
    server = make_server("127.0.0.1", 0, pg_url)
    serve_in_thread(server)
    try:
        pg_base = url_of(server)
        for page in (
            "",
            f"study/{GOLDEN_UID}",
            f"run/{a}",
            f"compare?a={a}&b={b}",
            f"plan/{GOLDEN_UID}",
            "api/studies",
            f"api/study/{GOLDEN_UID}/progress",
            f"api/run/{b}",
            "study/nope",
        ):
            want, got = get(base + page), get(pg_base + page)
            assert (got[0], got[1]) == (want[0], want[1]), page
    finally:
        server.shutdown()
        server.server_close()


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


@pytest.mark.parametrize(
    ("address", "url"),
    [
        (("127.0.0.1", 8080), "http://127.0.0.1:8080/"),
        (("::1", 8080, 0, 0), "http://[::1]:8080/"),
        ((b"127.0.0.1", 8080), "http://127.0.0.1:8080/"),  # the socket types allow bytes: print the name
        ((bytearray(b"::1"), 8080, 0, 0), "http://[::1]:8080/"),
    ],
)
def test_url_of_prints_the_host_as_text(address: tuple[object, ...], url: str) -> None:
    assert url_of(types.SimpleNamespace(server_address=address)) == url


def _cells(body: str, key: str) -> list[float]:
    return [float(v) for v in re.findall(rf'data-key="{key}" data-value="([^"]+)"', body)]


def test_a_runs_energy_cost_and_pareto_chart_are_shown(served: tuple[str, list[str]], tmp_path: Path) -> None:
    """The run page shows each level's J/out tok and $/M out tok as `runs show` reads them (the simulator's
    GPUs drew the power; no price was given, so the catalog's, said to be a default) and the run's output
    tok/s per GPU against tok/s per user with its front named; the comparison of two runs compares both."""
    base, (a, b) = served
    home = tmp_path / "ui-home"
    run_a, run_b = _shown(home, a), _shown(home, b)
    energy = [lv.summary.energy for lv in run_a.levels]
    cost = [lv.summary.cost for lv in run_a.levels]
    assert all(e is not None for e in energy) and all(c is not None for c in cost)
    status, body, _ = get(f"{base}run/{a}")
    assert status == 200
    assert _cells(body, "j_per_output_token") == [e.j_per_output_token for e in energy if e is not None]
    assert _cells(body, "usd_per_m_output_tokens") == [
        c.usd_per_m_output_tokens for c in cost if c is not None
    ]
    (note,) = re.findall(r'<p class="note" id="cost-note">([^<]*)</p>', body)
    first = cost[0]
    assert first is not None and first.is_default
    assert f"{first.price_source}, a default" in html.unescape(note) and f"× {first.gpus} GPUs" in note
    assert 'id="fig-pareto"' in body and f"level {run_a.levels[0].value:g}" in body
    status, body, _ = get(f"{base}compare?a={a}&b={b}")
    ja, jb = run_a.levels[0].summary.energy, run_b.levels[0].summary.energy
    assert status == 200 and ja is not None and jb is not None
    assert ja.j_per_output_token is not None and jb.j_per_output_token is not None
    change = (jb.j_per_output_token - ja.j_per_output_token) / ja.j_per_output_token * 100
    assert (
        f"<td>J/out tok</td><td>{ja.j_per_output_token:.3f}</td><td>{jb.j_per_output_token:.3f}</td><td>{change:+.1f} %"
        in body
    )
    assert "$/M out tok" in body


def test_the_study_page_draws_the_pareto_front_with_its_members(served: tuple[str, list[str]]) -> None:
    """The study page is the report's body: the chart of output tok/s per GPU against tok/s per user, each
    member of the front the report model names labelled on it."""
    base, _ = served
    model = json.loads(get(f"{base}api/study/{GOLDEN_UID}")[1])
    status, body, _ = get(f"{base}study/{GOLDEN_UID}")
    assert status == 200 and 'id="fig-pareto"' in body and model["pareto_front"]
    chart = body[body.index('id="fig-pareto"') :]
    chart = chart[: chart.index("</svg>")]
    for m in model["pareto_front"]:
        assert html.escape(f"{m['candidate']} @ {m['level']:g}") in chart, m
