"""The plan: a persistent todo list whose items can be bound to experiments.

Pure: a `Plan` goes in, a new `Plan` plus the `Event`s that explain it come out; the store writes both in
one transaction. items (the data), machine (the rules and the operations on one item), study (items bound
to a study's candidates, and the evidence a run gives), formats (todowrite, JSON, markdown), checks (open
items against what `servelab status` observes).
"""
