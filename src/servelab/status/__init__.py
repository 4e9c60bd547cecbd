"""`servelab status`: what is true right now, each finding with its evidence and a next step.

`service.observe()` gathers GPUs, topology, servers, services, leftovers and the last log into one dict;
every part degrades to "not available, because ..." rather than failing, so the command answers on a
laptop, in CI and on a GPU box alike. `servelab plan check` consumes the dict: its top-level keys and the
keys of `servers[]`, `services[]` and `findings[]` are a stable contract (docs/cli/status.md). The rooms:
probes.py (the servers over HTTP, on an event loop of its own), stored.py (what the store says: the last
run, unfinished studies, deployments), judge.py (pure: whose each process is, findings, the verdict),
service.py (`observe` and `diagnose_host`, which compose them about one Host)."""
