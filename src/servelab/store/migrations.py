"""Schema migrations, keyed by name and applied in order.

Never edit a migration that has shipped: add a new one. The `migrations` table records which names
have been applied, so a database created by any earlier version upgrades in place.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_bench",
        """
        CREATE TABLE bench_runs (
            id INTEGER PRIMARY KEY,
            uid TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL,              -- running | completed | interrupted | failed
            url TEXT NOT NULL,
            model TEXT NOT NULL,
            api TEXT NOT NULL,
            engine TEXT,
            dataset_hash TEXT,
            config_json TEXT NOT NULL,         -- the full, redacted bench configuration
            warnings_json TEXT NOT NULL DEFAULT '[]',
            summary_json TEXT
        );
        CREATE TABLE bench_levels (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES bench_runs(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            mode TEXT NOT NULL,                -- concurrency | rate
            value REAL NOT NULL,
            max_concurrency INTEGER,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL,              -- running | completed | interrupted
            summary_json TEXT,
            server_metrics_json TEXT,          -- /metrics before/after/deltas and samples
            client_stats_json TEXT,            -- the client's own CPU, loop lag, send lateness
            UNIQUE (run_id, idx)
        );
        CREATE TABLE bench_requests (
            id INTEGER PRIMARY KEY,
            level_id INTEGER NOT NULL REFERENCES bench_levels(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            prompt_idx INTEGER NOT NULL,
            scheduled_s REAL,                  -- offset from the level start at which it was due
            start_s REAL NOT NULL,             -- offset at which it was actually sent
            ok INTEGER NOT NULL,
            ttft_s REAL,
            e2e_s REAL,
            itl_json TEXT,                     -- gaps between streamed chunks, seconds
            input_tokens INTEGER,
            output_tokens INTEGER,
            requested_output_tokens INTEGER,
            token_source TEXT,                 -- usage | tokenizer | chunks
            error_kind TEXT,
            error_message TEXT
        );
        CREATE INDEX bench_requests_level ON bench_requests(level_id);
        """,
    ),
    (
        "0002_calibrations",
        """
        CREATE TABLE calibrations (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            kind TEXT NOT NULL,                -- fit | host
            source TEXT NOT NULL,              -- CSV path, run uids, or the host probed
            gpu TEXT,                          -- the GPU kind a host calibration measured
            factors_json TEXT NOT NULL,        -- Factors fields that override the defaults
            report_json TEXT NOT NULL DEFAULT '{}'
        );
        """,
    ),
]
