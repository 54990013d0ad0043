"""A worker of test_transactions.py, run as ``python -m tests.map._txn_worker TARGET MAP ROLE
SEED OUT``; it prints ``ready`` once the map is open and starts when the file OUT.go exists. ``txn``: 150 transactions that expect the values of ``{t}:a`` and ``{t}:b`` it
reads locally and write both plus one; ``put``: 150 rounds of plain puts to ``{t}:a`` and
``{t}:c``. Writes a JSON report to OUT: the role, the replica's origin (hex) and each
transaction's result in call order."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import kafkakv

ROUNDS = 150


def main(target: str, name: str, role: str, seed: str, out: str) -> None:
    rng = random.Random(int(seed))
    options = {"timeout": 60.0} if target.startswith("kafka://") else {}
    results: list[bool] = []
    with kafkakv.connect(target, **options) as db:
        m = db.map(name, hash_tags=True, flush_period=1_000_000, create=False)
        print("ready", flush=True)
        while not os.path.exists(out + ".go"):  # every worker starts at once
            time.sleep(0.005)
        for _ in range(ROUNDS):
            if role == "txn":
                a, b = m.get("{t}:a"), m.get("{t}:b")
                put = {"{t}:a": (a or 0) + 1, "{t}:b": (b or 0) + 1}
                results.append(m.transaction(expect={"{t}:a": a, "{t}:b": b}, put=put))
            else:
                m.put("{t}:a", rng.randrange(1000))
                m.put("{t}:c", rng.randrange(1000))
        origin = m._engine.origin.hex()
    report = {"role": role, "origin": origin, "results": results, "wins": sum(results)}
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
