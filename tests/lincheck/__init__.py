"""Linearizability of recorded map histories, checked by porcupine (a Go library).

``main.go`` beside this file is a small command around porcupine's checker with kafkakv's
map as the sequential model (its ``step`` says what each operation returns and leaves).
:func:`build` compiles it with the Go toolchain (modules from the Go proxy, kept in Go's
module and build caches); :func:`check` hands it a history and returns its verdict.

A history is a list of :class:`Op`: what was called, when it was called and when it returned
on one clock (``time.monotonic_ns``, shared by every process of a machine), and what it
returned. An op whose outcome is unknown (its process was killed during it, or it raised) is
taken to stay pending to the end: it may have happened at any time after its call, or never.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Op", "Verdict", "build", "check", "read_history"]

SOURCE = Path(__file__).parent

#: Operation kinds the model knows (main.go's ``step``).
KINDS = frozenset(
    {
        "get",
        "contains",
        "put",
        "put_blind",
        "put_if_absent",
        "replace",
        "compare_and_set",
        "remove",
        "remove_blind",
        "remove_if",
        "compute_append",
        "get_versioned",
        "compare_version_and_set",
    }
)


@dataclasses.dataclass
class Op:
    """One call: ``value`` and ``expected`` are its arguments ("" for none), ``output`` what
    it returned (a value, "" for absent or None, or "true"/"false"); ``known`` False when its
    outcome is unknown (then ``ret`` is None or ignored)."""

    client: int
    kind: str
    key: str
    call: int
    ret: int | None = None
    value: str = ""
    expected: str = ""
    output: str = ""
    known: bool = False
    error: str = ""  # what it raised, if it raised

    def as_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "kind": self.kind,
            "key": self.key,
            "value": self.value,
            "expected": self.expected,
            "call": self.call,
            "return": self.ret,
            "output": self.output,
            "known": self.known,
        }


@dataclasses.dataclass
class Verdict:
    result: str  # "ok", "illegal", "unknown" (out of time) or "error" (bad input)
    operations: int
    detail: str  # the checker's own line, and where a counterexample was drawn

    @property
    def ok(self) -> bool:
        return self.result == "ok"


def build(into: Path) -> Path:
    """Compile the checker into directory ``into``; return the program's path. Fails with the
    reason when Go is missing or the build fails (the modules come from the Go proxy)."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "the linearizability checker is written in Go (porcupine) and `go` is not on PATH: "
            "install Go 1.21 or later (Debian: apt-get install golang-go)"
        )
    program = into / "lincheck"
    run = subprocess.run(
        [go, "build", "-buildvcs=false", "-o", str(program), "."],
        cwd=SOURCE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"`go build` of {SOURCE} failed:\n{run.stdout}{run.stderr}")
    return program


def check(
    program: Path,
    history: Sequence[Op],
    *,
    visualize: Path | None = None,
    timeout: float = 120.0,
) -> Verdict:
    """Porcupine's verdict on ``history``; an illegal one is drawn to ``visualize`` (HTML)."""
    for op in history:
        if op.kind not in KINDS:
            raise ValueError(f"unknown operation kind {op.kind!r}")
    args = [str(program), f"-timeout={timeout}s"]
    if visualize is not None:
        args.append(f"-visualize={visualize}")
    run = subprocess.run(
        args,
        input=json.dumps([op.as_json() for op in history]),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )
    try:
        line = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(
            f"the checker said nothing readable: {run.stdout!r} {run.stderr!r}"
        ) from None
    return Verdict(str(line["result"]), int(line.get("operations", 0)), run.stdout.strip())


def read_history(paths: Iterable[Path]) -> list[Op]:
    """The ops the workers wrote (``workload.Recorder``): a line when each call starts and one
    when it returns or raises. A call without a return line is one whose process died in it."""
    ops: dict[str, Op] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.endswith("}"):  # a line cut short by a kill
                continue
            event = json.loads(line)
            ident = event["id"]
            if "call" in event:
                ops[ident] = Op(
                    client=event["client"],
                    kind=event["kind"],
                    key=event["key"],
                    call=event["call"],
                    value=event.get("value", ""),
                    expected=event.get("expected", ""),
                )
            else:
                op = ops[ident]
                if "error" in event:
                    op.error = event["error"]
                else:
                    op.ret = event["return"]
                    op.output = event["output"]
                    op.known = True
    return list(ops.values())
