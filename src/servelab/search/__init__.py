"""Adaptive search over a study's `[search.space]`: grid, Optuna (TPE / NSGA-II) and successive halving.

`space` turns the study file's space into typed parameters and candidates; `prune` learns the regions a
failed, not-applied or collapsed trial rules out; `strategies` propose the next candidate from the
history the store holds (so a resumed search continues from exactly what was stored); `prior` ranks
points with the performance model, refitted from the study's own measured runs.
"""
