"""The servelab agent (layer 6, above every room whose operations it runs): its serve loop (serve), its
operation table and state (registry), and one module per operation group (ops_core, ops_observe, ops_logs,
ops_deploy, ops_bench), listed once in `serve.GROUPS`. Run as `python -m servelab.agent`."""
