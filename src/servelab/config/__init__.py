"""The study file (TOML) as validated pydantic models: model, host, engine, candidates, workload, load, SLOs.

Every error names the field path (`candidates[2].tp`, `slo.ttft_ms.p99`) and what is expected, so a
typo in a study is a one-line fix, not a traceback. See docs/study.md for every field. The rooms:
sections.py (each table's model), matrix.py (`[matrix]` → candidates), study.py (`Study`: the whole file
and its cross-table checks), problems.py (problems with their field paths), loading.py (`parse_study`,
`load_study`: the entry points, every problem listed)."""
