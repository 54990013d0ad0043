"""A change-feed consumer for test_changes.py, run as ``python -m tests.map._feed_consumer
TARGET MAP OUT FIRST_CURSOR``: it appends one JSON line per change to OUT, each with the
change's cursor, and on start resumes from the cursor of OUT's last complete line (a line cut
by a kill is dropped), or from FIRST_CURSOR. The line is both the handling and the stored
cursor, so a kill cannot separate them."""

from __future__ import annotations

import json
import os
import sys

import kafkakv


def resume_point(out: str, first: str) -> str:
    """The cursor of the last complete line of ``out`` (cutting off a partial one), or
    ``first``."""
    if not os.path.exists(out):
        return first
    with open(out, "rb+") as f:
        data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        f.truncate(len(complete))
    lines = complete.decode().splitlines()
    return str(json.loads(lines[-1])["cursor"]) if lines else first


def main(target: str, name: str, out: str, first: str) -> None:
    since = resume_point(out, first)
    options = {"timeout": 60.0} if target.startswith("kafka://") else {}
    with kafkakv.connect(target, **options) as db:
        m = db.map(name, create=False)
        with open(out, "a") as f, m.changes(since=since) as feed:
            print("ready", flush=True)
            for c in feed:
                line = {"p": c.partition, "key": c.key, "old": c.old, "new": c.new}
                f.write(json.dumps({**line, "cursor": str(c.cursor)}) + "\n")
                f.flush()


if __name__ == "__main__":
    main(*sys.argv[1:5])
