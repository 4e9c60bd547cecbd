"""Launch a server process tree, wait until it is really ready, and tear it down leaving nothing behind.

    server = local.launch(spec, log_path, run_marker="study-7/cand-3/try-1")
    try:
        ready = await wait_ready(server, engine.readiness, engine.startup_timeout_s, engine.name)
        ...
    finally:
        report = teardown(server)          # report.clean: no process, port, segment or GPU memory left

`handle` (ServerHandle, the one protocol every caller speaks; TeardownReport), `local` (a process tree on
this machine), `remote` (one a host's agent runs), `probe` and `ready` (readiness), `serving` (launch_on,
teardown, sweep_orphans, serving). Import from the module that owns a name; this package exports nothing.
"""
