"""How long `servelab plan import` takes for N todos (issue 15 item 12: it was quadratic).

Runs the real CLI on a fresh store: an import of N new todos, then the same file again (every todo
matched and unchanged), then a third time with every status changed. Usage:

    python benchmarks/plan_import.py 32000 100000
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def todos(n: int, status: str) -> list[dict[str, str]]:
    # half with ids, half matched by content: both lookup paths are exercised
    return [
        {"content": f"task {i}", "status": status, "priority": "medium", **({"id": f"t{i}"} if i % 2 else {})}
        for i in range(n)
    ]


def timed(home: Path, file: Path) -> float:
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "servelab", "plan", "import", str(file), "--json"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [32000]:
        with tempfile.TemporaryDirectory() as tmp:
            home, file = Path(tmp) / "home", Path(tmp) / "todos.json"
            file.write_text(json.dumps(todos(n, "pending")))
            first = timed(home, file)
            again = timed(home, file)
            file.write_text(json.dumps(todos(n, "cancelled")))
            changed = timed(home, file)
        print(f"{n:>7} todos: new {first:6.1f} s, unchanged {again:6.1f} s, all changed {changed:6.1f} s")


if __name__ == "__main__":
    main()
