"""`[matrix]`: the cartesian product of candidate fields (and `variants`, values that go together) as
candidates."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from servelab.config.sections import CandidateSpec, label_parts


def expand_matrix(matrix: dict[str, list[Any]]) -> list[CandidateSpec]:
    """The cartesian product of the matrix axes. An axis is a candidate field with a list of values, or
    `variants`: a list of partial candidate tables for values that go together (tp = 4 with pp = 2). A
    variant may carry a `name`: an item's name is then its variants' names, then the label pieces of the
    fields its unnamed parts set (`variants = [{name = "wide", tp = 8}]` × `max_concurrency = [64]`:
    `wide-c64`)."""
    if not matrix:
        return []
    axes: list[list[dict[str, object]]] = []
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"matrix.{key} must be a non-empty list")
        if key == "variants":
            if not all(isinstance(v, dict) for v in values):
                raise ValueError(
                    "matrix.variants must be a list of tables, e.g. [{tp = 8}, {tp = 4, pp = 2}]"
                )
            for j, v in enumerate(values):
                if "baseline" in v:
                    raise ValueError(f"matrix.variants[{j}]: baseline belongs on a [[candidates]] table")
                if "name" in v and (not isinstance(v["name"], str) or not v["name"]):
                    raise ValueError(f"matrix.variants[{j}].name must be a non-empty string")
            axes.append([dict(v) for v in values])
        elif key in CandidateSpec.model_fields and key not in ("name", "baseline"):
            axes.append([{key: v} for v in values])
        else:
            known = ", ".join(sorted(set(CandidateSpec.model_fields) - {"name", "baseline"}))
            raise ValueError(f"matrix.{key} is not a candidate field; use variants or one of: {known}")
    out: list[CandidateSpec] = []
    for combo in itertools.product(*axes):
        merged: dict[str, object] = {}
        names: list[str] = []
        unnamed: dict[str, object] = {}
        for part in combo:
            fields = {k: v for k, v in part.items() if k != "name"}
            if "name" in part:
                names.append(str(part["name"]))  # a non-empty string, checked above
            else:
                _merge(unnamed, fields)
            _merge(merged, fields)
        if names:
            merged["name"] = "-".join([*names, *label_parts(unnamed)])
        out.append(CandidateSpec.model_validate(merged))
    return out


def _merge(into: dict[str, object], part: Mapping[str, object]) -> None:
    """One matrix part onto an item: args append, env and options merge, the rest replaces."""
    for k, v in part.items():
        before = into.get(k)
        if k == "args" and isinstance(before, Iterable) and isinstance(v, list):
            into[k] = [*before, *v]
        elif k in ("env", "options") and isinstance(before, Mapping) and isinstance(v, dict):
            into[k] = {**before, **v}
        else:
            into[k] = v
