"""One trial of one candidate: launch → ready → effective config → verify → bench → teardown.

The rooms: `pipeline` (the `Trial` and its steps), `outcome` (the typed seams: `Target`, `AppliedCheck`,
`LevelResult`, `BenchRun`, `Finding`, `TrialOutcome`, `TrialObserver`), `prepare` (a candidate's settings,
the benchmark's configuration and the run's context) and `telemetry` (GPU power sampled during a level)."""
