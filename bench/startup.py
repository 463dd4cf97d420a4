"""Benchmark (not a test): how long the ``anabranch`` command takes to start.

Runs ``--help``, ``sessions`` and ``show ID`` on a small offline session, interleaved, with
this checkout's ``src`` and (optionally) another checkout's (``--baseline /work/main/src``),
plus ``python -c pass`` as the floor. Reports the median wall time and the median CPU time
(user + system of the child, less sensitive to a busy machine) of each, and the ratio of
each command to the floor, all from one run.

    python bench/startup.py [--baseline OTHER/src] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = os.times()
    start = time.perf_counter()
    subprocess.run(command, env=env, capture_output=True, timeout=120, check=False)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return wall, cpu


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(src)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout's src directory")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sources = {"this": ROOT / "src"}
    if args.baseline is not None:
        sources["baseline"] = args.baseline.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "startup.db")
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "anabranch",
                "run",
                f"{ROOT}/examples/research.py:supervisor",
                "Compare SQLite and DuckDB",
                "--offline",
                "--db",
                db,
            ],
            env=_env(ROOT / "src"),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        session = re.search(r"session (ses_\w+)", made.stderr)
        assert session, made.stderr
        commands = {
            "--help": ["--help"],
            "sessions": ["sessions", "--db", db],
            "show": ["show", session.group(1), "--db", db],
        }
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        floor: list[tuple[float, float]] = []
        for _ in range(args.repeat):
            floor.append(_timed([sys.executable, "-c", "pass"], _env(ROOT / "src")))
            for label, src in sources.items():
                for name, argv in commands.items():
                    run = _timed([sys.executable, "-m", "anabranch", *argv], _env(src))
                    samples.setdefault((label, name), []).append(run)
    floor_wall = statistics.median(w for w, _ in floor)
    floor_cpu = statistics.median(c for _, c in floor)
    print(f"python -c pass: wall {floor_wall:.3f}s, cpu {floor_cpu:.3f}s (median of {args.repeat})")
    print(f"{'checkout':<9} {'command':<9} {'wall s':>7} {'cpu s':>7} {'cpu/floor':>9}")
    for (label, name), runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{label:<9} {name:<9} {wall:>7.3f} {cpu:>7.3f} {cpu / floor_cpu:>9.1f}x")


if __name__ == "__main__":
    main()
