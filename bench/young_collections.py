"""What the cyclic GC's young collections walk per model call in ``bench/concurrency.py``.

A gen-0 or gen-1 collection costs about one visit per object in the generation it
collects; what a call keeps alive across an await (the model's latency, a store write's
wait for the writer thread) is in those generations when one runs. Counted at the start of
every collection of one ``trial(folder, runs, latency)`` (supervisor mix): collections per
1,000 model calls, the mean and median size of the collected generation, and the objects
the gen-0 and gen-1 collections walked per model call (their sizes summed over the trial,
divided by its model calls). Near-deterministic, unlike CPU: the evidence for a change to
what a call holds while it waits.

Run: ``PYTHONPATH=src:. python -m bench.young_collections [on|off] [runs] [latency]``
(tracing on or off; default on 1000 0.2). Prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import anyio

from bench import concurrency


def main() -> None:
    tracing = (sys.argv[1] if len(sys.argv) > 1 else "on") == "on"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    latency = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    sizes: dict[int, list[int]] = {0: [], 1: [], 2: []}

    def at_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generation = info["generation"]
            # a full collection walks the whole heap: counted, not sized
            sizes[generation].append(
                len(gc.get_objects(generation=generation)) if generation < 2 else 0
            )

    folder = Path(tempfile.mkdtemp(prefix="young-collections-"))
    gc.callbacks.append(at_collection)
    try:
        result = anyio.run(lambda: concurrency.trial(folder, runs, latency, tracing=tracing))
    finally:
        gc.callbacks.remove(at_collection)
        shutil.rmtree(folder, ignore_errors=True)
    calls = result["model_calls"]
    out: dict[str, object] = {"runs": runs, "tracing": tracing, "model_calls": calls}
    for generation, found in sizes.items():
        out[f"gen{generation}_per_1k_calls"] = round(len(found) / calls * 1000, 2)
        if generation < 2 and found:
            out[f"gen{generation}_mean_size"] = round(statistics.mean(found))
            out[f"gen{generation}_median_size"] = round(statistics.median(found))
    out["young_objects_walked_per_call"] = round((sum(sizes[0]) + sum(sizes[1])) / calls, 1)
    out["all_complete"] = result["all_complete"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
