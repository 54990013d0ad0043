"""Load benchmark of ``kafkakv serve``, the HTTP API, next to etcd's JSON gateway in the same run.

Command (from the project root)::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_serve.py [--rounds 3] [--duration 5]
        [--connections 32] [--threads 1] [--keys 10000] [--only NAMES] [--systems kafkakv,etcd]
        [--serve-arg=ARG ...] [--profile DIR] [--json FILE] [--dir DIR]

What it measures: requests per second and the p50/p99 latency of HTTP requests answered by a
server, with ``wrk`` (Debian package ``wrk``) as the load generator in a second process, over
kept-alive connections on 127.0.0.1. NAMES is a comma-separated subset of ``read,
read_serializable,read_linearizable,write``:

- ``read``: kafkakv ``GET /v1/maps/bench/keys/{key}`` (a local read, the default); etcd
  ``POST /v3/kv/range {"key": b64}``, linearizable (etcd's default). Target: kafkakv >= 2x.
- ``read_serializable``: etcd's range with ``"serializable": true``, a read from the member's
  own state without a round of consensus: the like-for-like peer of kafkakv's local read.
  Measured on etcd only; the table sets it next to kafkakv's ``read`` (no target).
- ``read_linearizable``: kafkakv ``GET ...?consistency=linearizable``; etcd's default range
  again (its figure in the table is the ``read`` one). Reported, no target.
- ``write``: kafkakv ``PUT /v1/maps/bench/keys/{key}`` with the JSON value as body; etcd
  ``POST /v3/kv/put``. Target: kafkakv >= 1x.

Data: ``--keys`` keys (10,000) of 16 characters (``_common.key``), each with a JSON object of
100 bytes as its value, preloaded before the rounds (kafkakv: ``PUT /v1/maps/bench``, then
``POST /v1/maps/bench/put`` in batches of 1,000; etcd: ``/v3/kv/txn`` of 100 puts each). Every
wrk thread cycles through all the keys, from its own offset, with requests built once in the
Lua ``init()`` (written to a scratch directory), so wrk spends its time on the network; writes
overwrite the preloaded keys with values of the same size.

Systems: kafkakv serve on the embedded log in a scratch directory (``python -m kafkakv serve
-p DIR --bind 127.0.0.1:PORT`` plus any ``--serve-arg``), ready when ``GET /v1/health``
answers 200; the log's default ``fsync="interval"``, so an acknowledged write is in the page
cache, not yet on disk. etcd 3.4 (Debian package ``etcd-server``) when ``/usr/bin/etcd`` or
``etcd`` on PATH exists: a single member with its own data directory and free 127.0.0.1 ports;
every etcd write is fsynced in its write-ahead log before the answer. Both servers are up for
the whole run; each is idle while the other is measured.

Method: ``wrk -t THREADS -c CONNECTIONS -d DURATION --latency`` with the same settings for both
systems. Every (system, workload) first runs a 2 s warm-up that is discarded. Then rounds: in
each round every workload is measured on every system back to back, the order of the systems
rotating by one each round (kafkakv round 1, etcd round 1, etcd round 2, kafkakv round 2...).
Each figure is the median over the rounds (latencies: the median of each round's p50 or p99,
which wrk computes over every request of the run). No means. Runs with errors (non-2xx answers,
timeouts, socket errors) are counted and flagged. The 1-minute load average is recorded before
each round; the CPU time of each server (its processes, from /proc) and of wrk over each run
gives CPU microseconds per request; "others" is the CPU that every other process of the
machine used meanwhile (busy time in /proc/stat minus the server's and wrk's), as % of one
core. On a shared machine each run first waits (at most ``--quiet-wait`` seconds, 30) until
the other processes use less than 25 % of a core over half a second; a run during which they
used more than 50 % is flagged "disturbed", and the table counts such runs.

The machine: wrk and the server under test share its cores (2 on the reference machine), so
every figure is for a server that has the machine minus one wrk thread (wrk takes 10-36 % of a
core). ``--connections`` takes a comma-separated list to sweep. 32 is the default: etcd's
gateway reads as fast at 16, 32 and 64 connections, while its writes gain from more (group
commit of its fsyncs: about 5,000/s at 16, 8,500/s at 32, 10,000/s at 64 here), kafkakv's
writes hardly (a saturated event loop); 32 is a middle pool size; docs/benchmarks.md gives 64 too.

``--profile DIR`` adds, after the rounds, one run of each kafkakv workload under
``py-spy record`` (``--format raw``, 250 samples/s, every thread) attached to the server, saves
the folded stacks in DIR and prints where the samples fall: per thread, per package, the
functions with the most samples on top of the stack (self) and on it anywhere (inclusive).

Every loop is bounded in count and time, and every process the script starts (servers, wrk,
py-spy) is stopped when it ends, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import http.client
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from typing import Any

from _common import die_with_parent, free_port, key, machine, terminate_as_interrupt

WORKLOADS = ("read", "read_serializable", "read_linearizable", "write")
SYSTEMS = ("kafkakv", "etcd")
MAP = "bench"
WARMUP_SECONDS = 2.0
QUIET_PCT = 25.0  # other processes' CPU, % of one core, under which a run starts
DISTURBED_PCT = 50.0  # ... over which a run is flagged as disturbed
READY_SECONDS = 60.0
VALUE_BYTES = 100
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")

WRK_SCRIPT = r"""
-- Written by benchmarks/bench_serve.py. Args: FILE OFFSET_FRACTION
-- FILE has one request a line: METHOD <tab> PATH <tab> BODY (BODY may be empty).
local requests = {}
local count = 0
local index = 0
id = 0
nthreads = 1

function setup(thread)
  thread:set("id", setup_count or 0)
  setup_count = (setup_count or 0) + 1
end

function init(args)
  for line in io.lines(args[1]) do
    local method, path, body = line:match("^([^\t]+)\t([^\t]+)\t(.*)$")
    local headers = {}
    if body == "" then
      body = nil
    else
      headers["Content-Type"] = "application/json"
    end
    count = count + 1
    requests[count] = wrk.format(method, path, headers, body)
  end
  index = (id * math.floor(count / tonumber(args[2]))) % count
end

function request()
  index = index % count + 1
  return requests[index]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_SERVE {\"requests\": %d, \"duration_us\": %d, \"bytes\": %d, " ..
    "\"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"max_us\": %d, " ..
    "\"errors\": {\"connect\": %d, \"read\": %d, \"write\": %d, \"status\": %d, " ..
    "\"timeout\": %d}}\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50.0), latency:percentile(90.0), latency:percentile(99.0), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def value_json(i: int) -> str:
    """The JSON text of the ``i``-th value: an object of exactly VALUE_BYTES bytes."""
    head = f'{{"n": {i}, "pad": "'
    return head + "x" * (VALUE_BYTES - len(head) - 2) + '"}'


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def http_call(
    port: int, method: str, path: str, body: Any = None, timeout: float = 30
) -> tuple[int, Any]:
    """One request on a new connection: status and the decoded JSON answer (or its text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, path, data, headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")
    finally:
        conn.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents[ppid].append(int(entry))
    found, todo = [], [pid]
    while todo and len(found) < 10_000:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` and its descendants so far."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLK_TCK


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (every state but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK  # user..steal, minus idle, iowait


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass
class Run:
    """One wrk run: its figures as wrk reports them, plus CPU time."""

    rate: float
    p50_us: float
    p90_us: float
    p99_us: float
    requests: int
    errors: dict[str, int]
    server_cpu_us_per_req: float
    server_cpu_pct: float
    wrk_cpu_pct: float
    others_cpu_pct: float  # every other process on the machine, as % of one core

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


@dataclasses.dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: str


class Bench:
    def __init__(self, args: argparse.Namespace, root: str) -> None:
        self.args = args
        self.root = root
        self.children: list[subprocess.Popen[bytes]] = []
        self.servers: dict[str, Server] = {}
        self.skipped: dict[str, str] = {}
        self.notes: list[str] = []
        self.request_files: dict[tuple[str, str], str] = {}
        self.script = os.path.join(root, "requests.lua")
        with open(self.script, "w") as f:
            f.write(WRK_SCRIPT)
        # results[connections][system][workload] -> one Run per round
        self.results: dict[int, dict[str, dict[str, list[Run]]]] = {}
        self.loads: list[float] = []
        self.waits_expired = 0

    # -- processes ------------------------------------------------------------------------
    def spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None) -> Any:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                die_with_parent(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc in self.children:
            self.children.remove(proc)

    def close(self) -> None:
        for proc in reversed(list(self.children)):
            self.stop(proc)

    def _tail(self, log: str, lines: int = 30) -> str:
        try:
            with open(log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, server: Server, ready: Any, what: str) -> None:
        """Call ``ready()`` until it is true, for at most READY_SECONDS."""
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                if ready():
                    return
            except (OSError, http.client.HTTPException):
                pass
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{server.name} did not become ready ({what}); its log:\n"
                    + self._tail(server.log)
                )
            time.sleep(0.05)

    # -- kafkakv ----------------------------------------------------------------------------
    def start_kafkakv(self) -> None:
        data = os.path.join(self.root, "kafkakv-log")
        os.makedirs(data)
        port = free_port()
        env = dict(os.environ)
        src = os.path.join(ROOT, "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "kafkakv", "serve", "-p", data]
        argv += ["--bind", f"127.0.0.1:{port}", *self.args.serve_arg]
        log = os.path.join(self.root, "kafkakv-serve.log")
        server = Server("kafkakv", port, self.spawn(argv, log, env), log)
        self.servers["kafkakv"] = server
        self.wait_ready(
            server, lambda: http_call(port, "GET", "/v1/health", timeout=2)[0] == 200, "health"
        )
        print(f"kafkakv: serve {' '.join(argv[3:])} (pid {server.proc.pid})")
        self.preload_kafkakv(server, data)

    def preload_kafkakv(self, server: Server, data: str) -> None:
        n, port = self.args.keys, server.port
        status, body = http_call(port, "PUT", f"/v1/maps/{MAP}", {"partitions": 1})
        if status in (200, 201):
            for start in range(0, n, 1000):
                items = {
                    key(i): json.loads(value_json(i)) for i in range(start, min(n, start + 1000))
                }
                status, body = http_call(port, "POST", f"/v1/maps/{MAP}/put", {"items": items})
                if status != 200:
                    break
            else:
                print(f"kafkakv: preloaded {n:,} keys through POST /v1/maps/{MAP}/put")
                self.check_kafkakv(port, n)
                return
            how = f"POST /v1/maps/{MAP}/put answered {status} {str(body)[:200]}"
        else:
            how = f"PUT /v1/maps/{MAP} answered {status} {str(body)[:200]}"
        # The routes are not there: write the keys from this process, another replica.
        import kafkakv

        note = f"kafkakv: {how}; preloaded through kafkakv.connect() in the benchmark instead"
        print(note)
        self.notes.append(note)
        with kafkakv.connect(data) as db:
            m = db.map(MAP, key_codec="str", value_codec="json")
            m.put_all([(key(i), json.loads(value_json(i))) for i in range(n)])
        self.check_kafkakv(port, n)

    def check_kafkakv(self, port: int, n: int) -> None:
        """The last preloaded key reads back through the API (waiting for the replica)."""
        last, expected = key(n - 1), json.loads(value_json(n - 1))
        deadline = time.monotonic() + READY_SECONDS
        while True:
            status, body = http_call(port, "GET", f"/v1/maps/{MAP}/keys/{last}")
            if status == 200 and isinstance(body, dict) and body.get("value") == expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafkakv: GET of a preloaded key answers {status} {body}")
            time.sleep(0.05)

    # -- etcd -------------------------------------------------------------------------------
    def start_etcd(self) -> None:
        binary = "/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else shutil.which("etcd")
        if binary is None:
            self.skip("etcd", "etcd not installed: apt-get install etcd-server")
            return
        data = os.path.join(self.root, "etcd-data")
        port, peer = free_port(), free_port()
        client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        argv = [binary, "--name", "bench", "--data-dir", data]
        argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
        argv += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        argv += ["--initial-cluster", f"bench={peer_url}", "--logger", "zap"]
        argv += ["--log-level", "error"]
        log = os.path.join(self.root, "etcd.log")
        server = Server("etcd", port, self.spawn(argv, log), log)
        self.servers["etcd"] = server
        probe = {"key": b64("ready"), "value": b64("1")}
        self.wait_ready(
            server, lambda: http_call(port, "POST", "/v3/kv/put", probe, 2)[0] == 200, "put"
        )
        version = subprocess.run([binary, "--version"], capture_output=True, text=True)
        print(f"etcd: {version.stdout.splitlines()[0]} (pid {server.proc.pid}, port {port})")
        n = self.args.keys
        for start in range(0, n, 100):
            ops = [
                {"request_put": {"key": b64(key(i)), "value": b64(value_json(i))}}
                for i in range(start, min(n, start + 100))
            ]
            status, body = http_call(port, "POST", "/v3/kv/txn", {"success": ops})
            if status != 200:
                raise RuntimeError(f"etcd: txn answered {status} {str(body)[:300]}")
        status, body = http_call(port, "POST", "/v3/kv/range", {"key": b64(key(n - 1))})
        kvs = body.get("kvs") if isinstance(body, dict) else None
        if (
            status != 200
            or not kvs
            or base64.b64decode(kvs[0]["value"]) != value_json(n - 1).encode()
        ):
            raise RuntimeError(f"etcd: range of a preloaded key answers {status} {body}")
        print(f"etcd: preloaded {n:,} keys through POST /v3/kv/txn")

    def skip(self, system: str, why: str) -> None:
        self.skipped[system] = why
        print(f"{system}: skipped ({why})")

    # -- requests ---------------------------------------------------------------------------
    def requests(self, system: str, workload: str) -> str | None:
        """The request file of one (system, workload), written once; None if not measured."""
        if (system, workload) in self.request_files:
            return self.request_files[(system, workload)]
        n = self.args.keys
        lines = []
        if system == "kafkakv":
            if workload == "read_serializable":
                return None
            for i in range(n):
                path = f"/v1/maps/{MAP}/keys/{key(i)}"
                if workload == "read":
                    lines.append(f"GET\t{path}\t")
                elif workload == "read_linearizable":
                    lines.append(f"GET\t{path}?consistency=linearizable\t")
                else:
                    lines.append(f"PUT\t{path}\t{value_json(n + i)}")
        else:
            if workload == "read_linearizable":
                return None  # etcd's default range: the ``read`` run
            for i in range(n):
                if workload == "read":
                    body: dict[str, Any] = {"key": b64(key(i))}
                    lines.append(f"POST\t/v3/kv/range\t{json.dumps(body)}")
                elif workload == "read_serializable":
                    body = {"key": b64(key(i)), "serializable": True}
                    lines.append(f"POST\t/v3/kv/range\t{json.dumps(body)}")
                else:
                    body = {"key": b64(key(i)), "value": b64(value_json(n + i))}
                    lines.append(f"POST\t/v3/kv/put\t{json.dumps(body)}")
        path = os.path.join(self.root, f"{system}-{workload}.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.request_files[(system, workload)] = path
        return path

    def wrk(self, system: str, workload: str, connections: int, seconds: float) -> Run | None:
        """One wrk run against ``system``; None if the pair is not measured."""
        requests = self.requests(system, workload)
        if requests is None:
            return None
        server = self.servers[system]
        threads = min(self.args.threads, connections)
        argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s"]
        argv += ["--latency", "--timeout", "10s", "-s", self.script]
        argv += [f"http://127.0.0.1:{server.port}/", "--", requests, str(threads)]
        if server.proc.poll() is not None:
            raise RuntimeError(f"{system} exited: see its log\n{self._tail(server.log)}")
        cpu0, wrk0, t0 = cpu_seconds(server.proc.pid), children_cpu(), time.perf_counter()
        busy0 = machine_busy()
        proc = subprocess.Popen(
            die_with_parent(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.children.append(proc)
        try:
            out, _ = proc.communicate(timeout=seconds + 60)
        finally:
            self.stop(proc)
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(server.proc.pid) - cpu0
        wrk_cpu = children_cpu() - wrk0
        others = max(0.0, machine_busy() - busy0 - cpu - wrk_cpu)
        text = out.decode(errors="replace")
        match = re.search(r"^BENCH_SERVE (\{.*\})$", text, re.MULTILINE)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"wrk failed ({proc.returncode}): {' '.join(argv)}\n{text}")
        fig = json.loads(match.group(1))
        requests_done = max(1, fig["requests"])
        return Run(
            rate=fig["requests"] / (fig["duration_us"] / 1e6),
            p50_us=fig["p50_us"],
            p90_us=fig["p90_us"],
            p99_us=fig["p99_us"],
            requests=fig["requests"],
            errors=fig["errors"],
            server_cpu_us_per_req=1e6 * cpu / requests_done,
            server_cpu_pct=100 * cpu / elapsed,
            wrk_cpu_pct=100 * wrk_cpu / elapsed,
            others_cpu_pct=100 * others / elapsed,
        )

    # -- rounds -----------------------------------------------------------------------------
    def measure(self, connections: int) -> None:
        systems = [s for s in SYSTEMS if s in self.servers]
        table: dict[str, dict[str, list[Run]]] = {s: {} for s in systems}
        self.results[connections] = table
        print(f"\n== {connections} connections, {self.args.threads} wrk thread(s) ==")
        for workload in self.args.only:
            for system in systems:
                self.wrk(system, workload, connections, WARMUP_SECONDS)  # warm-up, discarded
        for r in range(self.args.rounds):
            load = os.getloadavg()[0]
            self.loads.append(load)
            print(f"round {r + 1}: load average (1 min) before {load:.2f}")
            shift = r % len(systems)
            order = systems[shift:] + systems[:shift]
            for workload in self.args.only:
                for system in order:
                    self.wait_quiet()
                    run = self.wrk(system, workload, connections, self.args.duration)
                    if run is None:
                        continue
                    table[system].setdefault(workload, []).append(run)
                    flag = f"  ERRORS {run.errors}" if run.error_count else ""
                    if run.others_cpu_pct > DISTURBED_PCT:
                        flag += "  (disturbed)"
                    print(
                        f"  {system:<8} {workload:<18} {run.rate:>9,.0f} req/s  "
                        f"p50 {run.p50_us / 1e3:6.2f} ms  p99 {run.p99_us / 1e3:6.2f} ms  "
                        f"server {run.server_cpu_pct:3.0f}% CPU "
                        f"({run.server_cpu_us_per_req:.0f} us/req)  "
                        f"wrk {run.wrk_cpu_pct:3.0f}%  others {run.others_cpu_pct:3.0f}%{flag}"
                    )

    def wait_quiet(self) -> None:
        """Wait, at most ``--quiet-wait`` seconds, until the machine's other processes use
        less than QUIET_PCT of a core over half a second (other work on a shared machine)."""
        deadline = time.monotonic() + self.args.quiet_wait
        pids = [s.proc.pid for s in self.servers.values()]
        while True:
            busy0, own0, t0 = machine_busy(), sum(map(cpu_seconds, pids)), time.perf_counter()
            time.sleep(0.5)
            own = sum(map(cpu_seconds, pids)) - own0
            others = 100 * (machine_busy() - busy0 - own) / (time.perf_counter() - t0)
            if others < QUIET_PCT:
                return
            if time.monotonic() > deadline:
                self.waits_expired += 1
                return

    # -- results ----------------------------------------------------------------------------
    def medians(self, connections: int, system: str, workload: str) -> dict[str, Any] | None:
        runs = self.results[connections].get(system, {}).get(workload)
        if not runs:
            return None
        return {
            "rate": statistics.median(r.rate for r in runs),
            "p50_us": statistics.median(r.p50_us for r in runs),
            "p99_us": statistics.median(r.p99_us for r in runs),
            "server_cpu_us_per_req": statistics.median(r.server_cpu_us_per_req for r in runs),
            "server_cpu_pct": statistics.median(r.server_cpu_pct for r in runs),
            "wrk_cpu_pct": statistics.median(r.wrk_cpu_pct for r in runs),
            "others_cpu_pct": statistics.median(r.others_cpu_pct for r in runs),
            "errors": sum(r.error_count for r in runs),
            "disturbed": sum(r.others_cpu_pct > DISTURBED_PCT for r in runs),
            "rounds": [dataclasses.asdict(r) for r in runs],
        }

    ROWS = (
        # label, kafkakv workload, etcd workload, target ratio or None
        ("reads (etcd linearizable, its default)", "read", "read", 2.0),
        ("reads (etcd serializable)", "read", "read_serializable", None),
        ("linearizable reads", "read_linearizable", "read", None),
        ("writes", "write", "write", 1.0),
    )

    def table(self, connections: int) -> tuple[str, list[dict[str, Any]]]:
        head = ["workload", "kafkakv req/s", "p50", "p99", "etcd req/s", "p50", "p99"]
        head += ["kafkakv/etcd", "target", "met?"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = []
        for label, kv_work, etcd_work, target in self.ROWS:
            if kv_work not in self.args.only and etcd_work not in self.args.only:
                continue
            kv = self.medians(connections, "kafkakv", kv_work)
            et = self.medians(connections, "etcd", etcd_work)
            if kv is None and et is None:
                continue
            cells = [label]
            for fig in (kv, et):
                if fig is None:
                    cells += ["—", "—", "—"]
                else:
                    mark = " (errors!)" if fig["errors"] else ""
                    if fig["disturbed"]:
                        mark += f" ({fig['disturbed']} disturbed)"
                    cells += [
                        f"{fig['rate']:,.0f}{mark}",
                        f"{fig['p50_us'] / 1e3:.2f} ms",
                        f"{fig['p99_us'] / 1e3:.2f} ms",
                    ]
            ratio = kv["rate"] / et["rate"] if kv and et else None
            met = "—"
            if target is not None and ratio is not None:
                met = "yes" if ratio >= target else "NO"
            cells += [
                f"{ratio:.2f}x" if ratio is not None else "—",
                f">= {target:g}x" if target is not None else "—",
                met,
            ]
            lines.append("| " + " | ".join(cells) + " |")
            rows.append(
                {
                    "row": label,
                    "kafkakv_workload": kv_work,
                    "etcd_workload": etcd_work,
                    "kafkakv": kv,
                    "etcd": et,
                    "ratio": ratio,
                    "target": target,
                    "met": met,
                }
            )
        return "\n".join(lines), rows

    # -- profile ----------------------------------------------------------------------------
    def profile(self, directory: str, connections: int) -> dict[str, Any]:
        """One more run of each kafkakv workload under ``py-spy record --gil``: where the
        thread holding the GIL is, 250 times a second."""
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(spy):
            print("profile: py-spy not found (pip install py-spy); skipped")
            return {}
        os.makedirs(directory, exist_ok=True)
        pid = self.servers["kafkakv"].proc.pid
        seconds, rate = self.args.duration, 250
        found: dict[str, Any] = {}
        for workload in [w for w in self.args.only if self.requests("kafkakv", w)]:
            out = os.path.join(directory, f"kafkakv-{workload}.folded")
            argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--threads"]
            argv += ["--gil", "--nonblocking", "--format", "raw", "-o", out]
            argv += ["--duration", f"{seconds + 3:.0f}"]
            log = os.path.join(self.root, "py-spy.log")
            spy_proc = self.spawn(argv, log)
            time.sleep(1.0)  # py-spy attaches; the server is idle, so nothing is sampled
            run = self.wrk("kafkakv", workload, connections, seconds)
            with suppress(subprocess.TimeoutExpired):
                spy_proc.wait(seconds + 30)
            self.stop(spy_proc)
            if not os.path.exists(out):
                print(f"profile {workload}: py-spy wrote nothing; its log:\n{self._tail(log)}")
                continue
            summary = summarize_folded(out)
            summary["gil_held_pct"] = 100 * summary["samples"] / (rate * seconds)
            if run is not None:
                summary["run"] = dataclasses.asdict(run)
            found[workload] = summary
            print_profile(workload, summary, out, run)
        return found


def _frame_parts(frame: str) -> tuple[str, str]:
    """``'name (file:line)'`` -> (name, file)."""
    m = re.match(r"^(.*) \((.*?):?\d*\)$", frame)
    if m is None:
        return frame, ""
    return m.group(1), m.group(2)


def _package(path: str) -> str:
    """The package of a source file as py-spy names it (``starlette/routing.py``, sometimes
    a full path): its top-level package, or ``kafkakv.<subpackage>`` for ours."""
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = path.split("/", 1)[-1]
    parts = path.split("/")
    if parts[0] == "kafkakv" and len(parts) > 1:
        return "kafkakv." + parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py") or "?"


ENTRY_CHAIN = (
    "(click)",
    "(<frozen runpy>)",
    "(kafkakv.cli)",
    "(kafkakv.__main__)",
    " run (kafkakv.serve)",
    "Server.run (uvicorn)",
    "asyncio_run (uvicorn)",
    "Runner.run (asyncio)",
    "Thread._bootstrap (threading)",
    "Thread._bootstrap_inner (threading)",
    "Thread.run (threading)",
)
"""Frames that only lead to the server's loop or a thread's target: left out of "inclusive"."""


def summarize_folded(path: str) -> dict[str, Any]:
    """Read py-spy's folded stacks (one line a stack: frames joined by ``;``, then a count):
    the share of the samples per thread, per package of the frame on top, per function on top
    (self) and per function anywhere in the stack (inclusive; frames that are in every sample
    of their thread, such as the thread's entry point, are left out)."""
    threads: collections.Counter[str] = collections.Counter()
    selfs: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[tuple[str, str]] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = stack.split(";")
            thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
            frames = [fr for fr in frames if not fr.startswith(("thread", "process"))]
            if not frames:
                continue
            total += count
            threads[thread] += count
            name, file = _frame_parts(frames[-1])
            selfs[f"{name} ({_package(file)})"] += count
            packages[_package(file)] += count
            for fr in set(frames):
                name, file = _frame_parts(fr)
                incl[(thread, f"{name} ({_package(file)})")] += count
    inclusive: collections.Counter[str] = collections.Counter()
    for (thread, frame), count in incl.items():
        if count < threads[thread] and not (" " + frame).endswith(ENTRY_CHAIN):
            inclusive[frame] += count

    def share(c: collections.Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, 100 * v / max(1, total)) for k, v in c.most_common(n)]

    return {
        "samples": total,
        "threads": share(threads, 8),
        "packages_self": share(packages, 15),
        "self": share(selfs, 25),
        "inclusive": share(inclusive, 30),
    }


def print_profile(workload: str, s: dict[str, Any], path: str, run: Run | None) -> None:
    print(f"\nprofile of kafkakv serve, {workload}: {s['samples']} samples with the GIL held")
    if run is not None:
        print(
            f"  during {run.rate:,.0f} req/s, server {run.server_cpu_pct:.0f}% CPU, "
            f"{run.server_cpu_us_per_req:.0f} us CPU/request; "
            f"GIL held {s['gil_held_pct']:.0f}% of the run; folded stacks in {path}"
        )
    for title in ("threads", "packages_self", "self", "inclusive"):
        print(f"  {title} (% of the samples):")
        for name, pct in s[title]:
            print(f"    {pct:5.1f}%  {name}")


def _git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each wrk run")
    parser.add_argument("--connections", default="32", help="one count, or a list: 16,64")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="kafkakv,etcd or one")
    parser.add_argument("--serve-arg", action="append", default=[], help="for kafkakv serve")
    parser.add_argument("--profile", metavar="DIR", default=None)
    parser.add_argument("--quiet-wait", type=float, default=30.0, help="seconds, per run")
    parser.add_argument("--json", metavar="FILE", default=None)
    parser.add_argument("--dir", default=None, help="where the scratch directory goes")
    args = parser.parse_args()
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    counts = [int(c) for c in args.connections.split(",") if c.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if set(systems) - set(SYSTEMS) or not systems:
        parser.error("--systems takes kafkakv, etcd or both")
    if set(args.only) - set(WORKLOADS) or not args.only:
        parser.error(f"--only takes a subset of {','.join(WORKLOADS)}")
    if not 1 <= args.rounds <= 100 or not 0.5 <= args.duration <= 600 or args.keys < 1:
        parser.error("--rounds 1..100, --duration 0.5..600 seconds, --keys >= 1")
    if not counts or min(counts) < 1 or args.threads < 1:
        parser.error("--connections and --threads must be >= 1")
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk (Debian package wrk)", file=sys.stderr)
        return 2
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    info = {
        "machine": machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "wrk": wrk_version.splitlines()[0] if wrk_version else "?",
        "kafkakv_commit": _git_commit(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    print(f"machine: {info['machine']}")
    print(f"{info['wrk']}; kafkakv {info['kafkakv_commit']}; {info['started_utc']} UTC")
    print(
        f"wrk and the servers share the machine's {info['cores']} cores; "
        f"{args.rounds} rounds of {args.duration:g} s per workload, warm-up discarded"
    )
    root = tempfile.mkdtemp(prefix="kafkakv-bench-serve-", dir=args.dir)
    bench = Bench(args, root)
    output: dict[str, Any] = {"info": info, "settings": vars(args) | {"connections": counts}}
    load_start = os.getloadavg()[0]
    tables = []
    with terminate_as_interrupt():
        try:
            if "kafkakv" in systems:
                bench.start_kafkakv()
            if "etcd" not in systems:
                bench.skip("etcd", "not in --systems")
            else:
                bench.start_etcd()
            for connections in counts:
                bench.measure(connections)
            for connections in counts:
                text, rows = bench.table(connections)
                tables.append((connections, text, rows))
            if args.profile and "kafkakv" in bench.servers:
                output["profile"] = bench.profile(args.profile, counts[0])
        finally:
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    load_end = os.getloadavg()[0]
    print()
    for connections, text, _ in tables:
        print(
            f"wrk -t{args.threads} -c{connections} -d{args.duration:g}s, medians of {args.rounds} rounds:"
        )
        print(text)
        print()
    if bench.waits_expired:
        print(
            f"{bench.waits_expired} run(s) started with other processes busy after waiting "
            f"{args.quiet_wait:g} s for a quiet machine"
        )
    for note in bench.notes:
        print(f"note: {note}")
    for system, why in bench.skipped.items():
        print(f"{system}: skipped ({why})")
    loads = ", ".join(f"{x:.2f}" for x in bench.loads)
    print(
        f"load average (1 min): start {load_start:.2f}, before each round {loads}, end {load_end:.2f}"
    )
    output.update(
        skipped=bench.skipped,
        notes=bench.notes,
        load_1m_start=load_start,
        load_1m_rounds=bench.loads,
        load_1m_end=load_end,
        quiet_waits_expired=bench.waits_expired,
        tables={str(c): rows for c, _, rows in tables},
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(output, f, indent=1)
        print(f"results written to {args.json}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: every process the benchmark started is stopped", file=sys.stderr)
        sys.exit(130)
