"""What the adaptive search needs of whoever runs its trials (the Tuner): the search defines it, the tuner
satisfies it, so search/ never imports tune.

Every member is read-only here (a property or a method), so any object with these attributes and methods
fits, whatever it stores them as.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.events import Observer
from servelab.jsontypes import JsonObject
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StoredTrial, StudyRepo


class Slots(Protocol):
    """Where trials run: one at a time on a box, or several at once on a cluster of `capacity()` GPUs."""

    @property
    def parallel(self) -> bool: ...

    def capacity(self) -> int: ...


class TrialRunner(Protocol):
    """Runs and records the candidates the search stores; the search decides which, at which rung and how
    many times."""

    @property
    def study(self) -> Study: ...

    @property
    def store(self) -> Store: ...

    @property
    def repo(self) -> StudyRepo: ...

    @property
    def executor(self) -> Slots: ...

    @property
    def notify(self) -> Observer: ...

    def base_label(self) -> str:
        """The baseline candidate's label ("" while there is none)."""
        ...

    def baseline_levels(self, label: str) -> Sequence[Mapping[str, object]] | None:
        """The baseline's measured levels, its level digests read only (None for the baseline itself or before
        it ran)."""
        ...

    def predicted(self, cand: CandidateSpec) -> JsonObject | None:
        """The model's prediction stored with a new candidate (passed through to the store)."""
        ...

    def scored_trials(self, cand_id: int) -> list[StoredTrial]:
        """A candidate's measured trials that count towards its score."""
        ...

    def fill_plan(self, uid: str, cands: list[StoredCandidate]) -> None:
        """Add the candidates to the study's plan."""
        ...

    def set_rung(self, label: str, rung: int) -> None:
        """The rung the candidate's next trial runs at (halving: rung 0 is the short benchmark)."""
        ...

    def set_repeats(self, label: str, repeats: int) -> None:
        """How many measured trials the candidate needs (one while searching; contenders: the repeats)."""
        ...

    async def run_candidate(
        self, uid: str, cand: StoredCandidate, spec: CandidateSpec, upto: int | None = None
    ) -> bool:
        """Run the candidate's missing trials at its rung and store them and its outcome (True: it ended)."""
        ...
