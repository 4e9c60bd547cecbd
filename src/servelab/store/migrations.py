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
    (
        "0003_studies",
        """
        CREATE TABLE studies (
            id INTEGER PRIMARY KEY,
            uid TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            created_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL,              -- running | completed | interrupted | failed
            source TEXT,                       -- the study file's path
            spec_json TEXT NOT NULL,           -- the validated study, redacted
            spec_hash TEXT NOT NULL,           -- resume refuses a changed study unless told
            result_json TEXT                   -- ranking, winner, margin
        );
        CREATE TABLE study_candidates (
            id INTEGER PRIMARY KEY,
            study_id INTEGER NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,              -- order of execution (by predicted value when known)
            label TEXT NOT NULL,
            spec_json TEXT NOT NULL,
            predicted_json TEXT,               -- the performance model's view, when it knows the setup
            status TEXT NOT NULL,              -- pending | running | measured | not_applied | failed | anomalous
            outcome_json TEXT,
            UNIQUE (study_id, label)
        );
        CREATE TABLE study_trials (
            id INTEGER PRIMARY KEY,
            candidate_id INTEGER NOT NULL REFERENCES study_candidates(id) ON DELETE CASCADE,
            repeat INTEGER NOT NULL,
            status TEXT NOT NULL,              -- launching | verifying | benchmarking | measured | not_applied
                                               -- | failed | interrupted
            started_at TEXT NOT NULL,
            finished_at TEXT,
            marker TEXT NOT NULL,              -- SERVELAB_RUN value of its processes (orphan sweep on resume)
            argv_json TEXT,
            env_json TEXT,                     -- the added environment, redacted
            url TEXT,
            log_path TEXT,
            pid INTEGER,
            engine_version TEXT,
            requested_json TEXT,
            effective_json TEXT,               -- {"effective": {...}, "evidence": {...}}
            not_applied_json TEXT,             -- [{key, requested, effective, evidence}]
            diagnosis_json TEXT,
            verify_json TEXT,
            bench_run_id INTEGER REFERENCES bench_runs(id),
            levels_json TEXT,                  -- per level: metrics digest, telemetry, anomalies
            ready_s REAL,                      -- seconds from launch to ready
            teardown_json TEXT,
            error TEXT
        );
        CREATE INDEX study_trials_candidate ON study_trials(candidate_id);
        """,
    ),
    (
        "0004_plan",
        """
        CREATE TABLE plans (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,         -- "workspace", or the study's uid
            kind TEXT NOT NULL,                -- workspace | study
            study_uid TEXT,
            created_at TEXT NOT NULL
        );
        CREATE TABLE plan_items (
            id INTEGER PRIMARY KEY,
            plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,
            key TEXT NOT NULL,                 -- the id users and todowrite see
            position INTEGER NOT NULL,         -- order in the plan
            content TEXT NOT NULL,
            status TEXT NOT NULL,              -- pending | in_progress | completed | cancelled | blocked
            priority TEXT NOT NULL,            -- high | medium | low
            worker TEXT,                       -- who holds it while in progress
            depends_on_json TEXT NOT NULL DEFAULT '[]',
            notes_json TEXT NOT NULL DEFAULT '[]',
            binding_json TEXT,                 -- {"study", "candidate", "requested", "predicted", "url", "unit"}
            evidence_json TEXT NOT NULL DEFAULT '[]',  -- run records: applied or not, mismatches, diagnosis
            extra_json TEXT NOT NULL DEFAULT '{}',     -- todowrite keys servelab keeps verbatim
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (plan_id, key)
        );
        CREATE TABLE plan_events (
            id INTEGER PRIMARY KEY,
            item_id INTEGER NOT NULL REFERENCES plan_items(id) ON DELETE CASCADE,
            at TEXT NOT NULL,
            from_status TEXT,                  -- NULL when the item was created
            to_status TEXT NOT NULL,
            reason TEXT NOT NULL,
            actor TEXT NOT NULL,
            detail_json TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX plan_events_item ON plan_events(item_id);
        """,
    ),
    (
        "0005_deployments",
        """
        CREATE TABLE deployments (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,                -- the systemd unit / Compose service / Kubernetes objects' name
            created_at TEXT NOT NULL,
            target TEXT NOT NULL,              -- systemd | compose | kubernetes
            source TEXT NOT NULL,              -- STUDY_UID:CANDIDATE
            trial_id INTEGER REFERENCES study_trials(id),
            path TEXT,                         -- where the unit / manifest was written
            installed INTEGER NOT NULL DEFAULT 0,
            spec_json TEXT NOT NULL,           -- argv, env names, port, timeouts (redacted)
            status TEXT NOT NULL               -- written | installed | ready | failed
        );
        CREATE INDEX deployments_name ON deployments(name);
        CREATE TABLE deployment_checks (
            id INTEGER PRIMARY KEY,
            deployment_id INTEGER NOT NULL REFERENCES deployments(id) ON DELETE CASCADE,
            created_at TEXT NOT NULL,
            ok INTEGER NOT NULL,               -- 1: verified and within tolerance of the tuned result
            tolerance REAL NOT NULL,           -- relative, e.g. 0.1 for ±10 %
            level REAL,                        -- the study's main load level
            tuned_json TEXT,                   -- the trial's digest at that level
            measured_json TEXT,                -- the deployment's digest at that level
            verify_json TEXT,
            bench_run_id INTEGER REFERENCES bench_runs(id),
            verdict TEXT NOT NULL
        );
        """,
    ),
    (
        "0006_run_context",
        """
        -- What a run is of (servelab.results.RunContext): engine, model config, host, layout, formats, and
        -- the clock it was measured on (a simulator's --speed). NULL for runs stored before the contract.
        ALTER TABLE bench_runs ADD COLUMN context_json TEXT;
        """,
    ),
    (
        "0007_study_lease",
        """
        -- One driver per study (servelab.store.leases): the owner's pid, host and process start time (so a
        -- reused pid is not taken for the owner). Taken with one INSERT .. ON CONFLICT, or one UPDATE that
        -- names the stale owner it replaces; deleted when the driver exits.
        CREATE TABLE study_leases (
            study_id INTEGER PRIMARY KEY REFERENCES studies(id) ON DELETE CASCADE,
            pid INTEGER NOT NULL,
            host TEXT NOT NULL,
            proc_started REAL NOT NULL,        -- the owner process's start time, epoch seconds (/proc)
            acquired_at TEXT NOT NULL
        );
        -- The bench run a trial's level is measuring right now (NULL between levels): a resume marks it
        -- interrupted when a kill left it running.
        ALTER TABLE study_trials ADD COLUMN bench_open TEXT;
        -- The interrupted trial whose measured levels this one kept (NULL: started from the first level).
        ALTER TABLE study_trials ADD COLUMN resumed_from INTEGER REFERENCES study_trials(id);
        """,
    ),
    (
        "0008_trial_node",
        """
        -- The cluster node a trial ran on (servelab.results.Node: Ray node id, address, hostname, the GPUs
        -- it was given); NULL on one box. A trial whose node died is `lost` and is run again elsewhere.
        ALTER TABLE study_trials ADD COLUMN node_json TEXT;
        """,
    ),
    (
        "0009_request_session",
        """
        -- `bench --workload sessions`: the conversation a request belongs to and its turn index in it
        -- (RequestRecord.session_id / turn); NULL for every other workload.
        ALTER TABLE bench_requests ADD COLUMN session_id INTEGER;
        ALTER TABLE bench_requests ADD COLUMN turn INTEGER;
        """,
    ),
    (
        "0010_capacity",
        """
        -- An open-loop level's saturation verdict (servelab.results.Saturation), and a run's capacity
        -- search (servelab.results.CapacityResult); NULL where none was made.
        ALTER TABLE bench_levels ADD COLUMN saturation_json TEXT;
        ALTER TABLE bench_runs ADD COLUMN capacity_json TEXT;
        """,
    ),
    (
        "0011_level_series",
        """
        -- A level's /metrics samples and GPU telemetry as a time series on the client's timeline
        -- (servelab.results.LevelSeries, client clock); NULL for levels stored before it.
        ALTER TABLE bench_levels ADD COLUMN series_json TEXT;
        """,
    ),
    (
        "0012_search",
        """
        -- An adaptive search's view of a candidate (servelab.search): its point in [search.space], who
        -- proposed it (prior | model | sampler | rung | pruned), and for a pruned one the region that ruled
        -- it out; NULL for listed candidates. A trial's rung: halving's fidelity (0 = the short benchmark).
        ALTER TABLE study_candidates ADD COLUMN search_json TEXT;
        ALTER TABLE study_trials ADD COLUMN rung INTEGER;
        """,
    ),
    (
        "0014_startup",
        """
        -- A trial's start-up read from its engine's log (servelab.startup.StartupPhases: each phase's line,
        -- seconds from launch and the engine's own figure, the total to ready, cold or warm compile
        -- cache); NULL for an attached server and for trials stored before it.
        ALTER TABLE study_trials ADD COLUMN startup_json TEXT;
        """,
    ),
]
