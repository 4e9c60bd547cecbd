"""The studies repository: every state change is stored at once; secrets never are."""

from __future__ import annotations

from pathlib import Path

from servelab.store import open_store
from servelab.store.studies import StudyRepo


def test_study_candidates_trials_round_trip_and_open_trials(where: Path | str) -> None:
    db = where
    with open_store(db) as store:
        repo = StudyRepo(store)
        sid, uid = repo.create_study(
            "glm", "x.toml", {"engine": {"env": {"HF_TOKEN": "hf_abcdefghijkl"}}}, "h1"
        )
        cid = repo.add_candidate(sid, 0, "tp8", {"tp": 8}, {"output_throughput": 500.0})
        tid = repo.start_trial(cid, 0, f"servelab-study:{uid}:tp8:0")
        repo.update_trial(tid, argv=["python", "-m", "vllm", "--api-key", "sk-secretsecret"], pid=123)
    # a new connection sees everything (nothing buffered), and the unfinished trial is "open"
    with open_store(db) as store:
        repo = StudyRepo(store)
        st = repo.resolve(uid)
        assert st.spec["engine"]["env"]["HF_TOKEN"] == "***"
        [t] = repo.open_trials(st.id)
        assert t.pid == 123 and "sk-secretsecret" not in " ".join(t.argv or [])
        repo.update_trial(t.id, status="measured", levels=[{"level": 1.0}])
        assert repo.open_trials(st.id) == []
        assert repo.trials(cid)[0].finished_at is not None
        found = repo.latest_unfinished("glm")
        assert found is not None and found.uid == uid
        repo.set_study_status(sid, "completed", {"ranking": {"winner": "tp8"}})
        assert repo.latest_unfinished("glm") is None
        assert (repo.resolve("glm").result or {})["ranking"]["winner"] == "tp8"
