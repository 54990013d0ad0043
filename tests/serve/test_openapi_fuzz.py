"""The server against its own OpenAPI description: schemathesis generates requests from it
(every route, valid and invalid input, sequences of calls), and every answer must be one the
description allows: no server error, a listed status, content type and body schema, an
``Allow`` header that names the route's methods. On the embedded log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

import kafkakv
from kafkakv.serve.config import ServeConfig
from kafkakv.serve.server import serve_in_thread

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,allow_header_conformance"
)


def test_every_answer_is_one_the_description_allows(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with kafkakv.connect(log, background_cleaner=False) as db:
        config = ServeConfig(log, port=0, request_timeout=5.0)
        with serve_in_thread(config, db) as url:
            httpx.put(f"{url}/v1/maps/m", json={"partitions": 1}, timeout=30)
            httpx.put(f"{url}/v1/maps/m/keys/k", json={"a": 1}, timeout=30)
            run = subprocess.run(
                [
                    str(Path(sys.executable).with_name("schemathesis")),
                    "run",
                    f"{url}/v1/openapi.json",
                    "--checks",
                    CHECKS,
                    "--max-examples",
                    "20",
                    "--seed",
                    "20261126",
                    "--request-timeout",
                    "10",
                    "--exclude-path-regex",
                    "/changes$",  # a stream without end: test_api.py reads its events
                    "--suppress-health-check",
                    "filter_too_much,too_slow",
                ],
                capture_output=True,
                text=True,
                timeout=240,
                cwd=tmp_path,  # where it keeps its example database
            )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
