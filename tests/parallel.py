"""Pytest plugin: how the suite shares its worker processes (registered in conftest.py).

``bash scripts/test`` runs the suite on several pytest-xdist workers with ``--dist loadgroup``:
most tests wait (on brokers, subprocesses, fsync, timeouts) rather than compute, so a few
workers finish sooner even on two cores. Each worker is a pytest session of its own, with its
own session fixtures; so that it starts no more clusters than it must, every test that uses
an expensive shared resource belongs to a group (:func:`group_of`), and a group's tests all
run on one worker, in collection order:

- ``hosts``: the simulated hosts (``host_network``, ``hosts_cluster``): a second 3-broker
  cluster and its namespaces;
- ``kafka-faults``: the tests that stop, kill or pause brokers (``kafka_faults``), on a
  cluster of their worker's own that only they may see;
- ``kafka-single``: the 1-broker cluster with SASL and TLS listeners (``kafka_single``);
- ``spark``: the Spark session and the PostgreSQL server of the pipeline tests;
- ``module:<path>``: the tests of a module with a module-scoped fixture (a browser, a
  server, a built checker), which is then made once;
- the name of an ``xdist_group`` mark, for a test that carries one.

The tests that only use the 3-broker ``kafka_cluster`` (every test parametrized with the
``kafka`` backend too), the largest share of the suite, belong to no group: they all share
one cluster, which the controller starts when a worker first asks for it
(:mod:`tests.shared_cluster`), and run on every worker at once.

The rest go one by one to whichever worker is free, the biggest groups first.

A resource that only one group's tests use is given back as soon as the last of them has
ended, not at the end of the session (:func:`release_after_last_use`): the fault cluster, the
SASL/TLS broker, the simulated hosts and the Spark standalone cluster are done within the
first minutes of a run, and each idle 3-broker cluster kept using about 6 CPU-seconds a minute
(KRaft heartbeats, replica fetches) until the last test of the whole run had ended.

xdist's own ``loadgroup`` learns a test's group from a suffix it appends to the test's id,
which pytest 9.2's structured ids no longer allow (pytest-xdist issue 1386: every test then
runs wherever). So this plugin brings its own scheduler for ``--dist loadgroup``
(:class:`GroupScheduling`): each worker writes the groups it collected to a file the
controller named, and the controller's scheduler reads them.

A worker's Kafka ports are shifted by :data:`WORKER_PORT_STEP` times its index
(:func:`tests.kafka_cluster.port_offset`), so two workers that start a cluster never take the
same ports.

Without xdist (``-n 0``, or a plain ``pytest``) nothing changes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shared_cluster import SharedCluster

__all__ = [
    "SHARED_SLOT",
    "WORKER_PORT_STEP",
    "group_of",
    "release_after_last_use",
    "shared_folder",
    "worker_index",
]

BASE_PORT = 11092
"""The first port of the 3-broker test cluster (``kafka_cluster``) before any offset."""
EXTERNAL_ENV = "KAFKAKV_TEST_BOOTSTRAP"
PORT_OFFSET_ENV = "KAFKAKV_TEST_PORT_OFFSET"

WORKER_PORT_STEP = 10
"""The Kafka ports of worker ``gwN`` are the session's plus ``N * WORKER_PORT_STEP``: above
the 4 ports ``kafka_single`` takes from its base. The controller's shared cluster takes the
slot :data:`SHARED_SLOT`. Two concurrent sessions need offsets (``KAFKAKV_TEST_PORT_OFFSET``)
at least ``(SHARED_SLOT + 1) * WORKER_PORT_STEP`` (100) apart."""

SHARED_SLOT = 9
"""The port slot of the controller's shared cluster, past the workers' (at most 9: gw0-gw8)."""

_HOSTS = frozenset({"host_network", "hosts_cluster"})
_SPARK = frozenset({"spark", "postgres"})
_FOLDER_KEY = "kafkakv_folder"
_GROUPS_KEY = "kafkakv_groups"
_folder = pytest.StashKey[Path]()
_shared = pytest.StashKey[SharedCluster]()
_last_use = pytest.StashKey[dict[str, str]]()  # fixture -> id of the last test that uses it
_releases = pytest.StashKey[dict[str, list[Callable[[], object]]]]()


def worker_index(config: pytest.Config) -> int:
    """The index of this xdist worker (``gw3`` is 3), 0 outside xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return 0
    return int(str(workerinput["workerid"]).removeprefix("gw"))


def group_of(item: pytest.Item) -> str | None:
    """The group of ``item``: the shared resource it needs (see the module doc), else
    ``None``."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    names = set(getattr(item, "fixturenames", ()))
    if names & _HOSTS:
        return "hosts"
    if "kafka_faults" in names:
        return "kafka-faults"
    if "kafka_single" in names:
        return "kafka-single"
    if names & _SPARK:
        return "spark"
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for defs in info.name2fixturedefs.values():
            if any(d.scope in ("module", "package", "class") for d in defs):
                return f"module:{item.nodeid.split('::')[0]}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers this mark; a run without xdist must accept it too (--strict-markers).
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker (loadgroup)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker of a ``loadgroup`` run: write each grouped test's group where the
    controller reads it (one file per worker, written whole)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or _GROUPS_KEY not in workerinput:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    config.stash[_last_use] = _last_uses(items, groups)
    folder = Path(workerinput[_GROUPS_KEY])
    partial = folder / f"groups-{workerinput['workerid']}.partial"
    partial.write_text(json.dumps(groups), encoding="utf-8")
    os.replace(partial, folder / f"groups-{workerinput['workerid']}.json")


def _last_uses(items: list[pytest.Item], groups: dict[str, str]) -> dict[str, str]:
    """For each fixture that the tests of one group use and no other test does: the id of the
    last of them. The group runs whole on one worker, in collection order, so once that test
    has ended on this worker, no test will need the fixture again."""
    users: dict[str, list[str]] = {}
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            users.setdefault(name, []).append(item.nodeid)
    last = {}
    for name, ids in users.items():
        if len({groups.get(i) for i in ids}) == 1 and groups.get(ids[0]) is not None:
            last[name] = ids[-1]
    return last


def release_after_last_use(request: pytest.FixtureRequest, release: Callable[[], object]) -> None:
    """For a session-scoped fixture (``request``'s): call ``release`` as soon as the last test
    that uses the fixture has ended on this worker, when that is known (a worker of a
    ``loadgroup`` run, the fixture used by one group's tests only); otherwise nothing. The
    fixture's own finalizer still runs at the end of the session: ``release`` must be
    idempotent."""
    if request.fixturename in request.config.stash.get(_last_use, {}):
        releases = request.config.stash.setdefault(_releases, {})
        releases.setdefault(request.fixturename, []).append(release)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's whole run (its teardown and the deletion of its topics too): give back
    what no later test on this worker uses (see :func:`release_after_last_use`), the fixture
    set up last first."""
    yield
    releases = item.config.stash.get(_releases, None)
    if not releases:
        return
    last = item.config.stash[_last_use]
    for name in [n for n in reversed(releases) if last[n] == item.nodeid]:
        for release in reversed(releases.pop(name)):
            try:
                release()
            except Exception as exc:  # the session's finalizer tries again
                warnings.warn(f"giving back {name} after its last test: {exc!r}", stacklevel=1)


def shared_folder(config: pytest.Config) -> Path | None:
    """On an xdist worker: the folder it shares with the controller (groups, the shared
    cluster); ``None`` outside xdist."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or _FOLDER_KEY not in workerinput:
        return None
    return Path(workerinput[_FOLDER_KEY])


def _loadgroup(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and config.getoption("dist", None) == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """On the controller: give each worker the shared folder, where it writes its groups (a
    ``loadgroup`` run) and asks for the shared cluster, which this starts on first use."""
    config: pytest.Config = node.config
    if _folder not in config.stash:
        folder = Path(tempfile.mkdtemp(prefix="kafkakv-xdist-"))
        config.stash[_folder] = folder
        if not os.environ.get(EXTERNAL_ENV):
            offset = int(os.environ.get(PORT_OFFSET_ENV) or 0)
            base = BASE_PORT + offset + SHARED_SLOT * WORKER_PORT_STEP
            config.stash[_shared] = SharedCluster(folder, base)
    node.workerinput[_FOLDER_KEY] = str(config.stash[_folder])
    if _loadgroup(config):
        node.workerinput[_GROUPS_KEY] = str(config.stash[_folder])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """On the controller of a ``loadgroup`` run: :class:`GroupScheduling`."""
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scheduling by scope, a test's scope being its group (from the files the
        workers wrote) or, for a test in none, the test itself."""

        groups: dict[str, str] | None = None

        def schedule(self) -> None:
            if self.groups is None:
                self.groups = {}
                folder = config.stash.get(_folder, None)
                for path in sorted(folder.glob("groups-*.json")) if folder is not None else ():
                    self.groups = json.loads(path.read_text(encoding="utf-8"))
                    break
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            group = (self.groups or {}).get(nodeid)
            return nodeid if group is None else f"group:{group}"

    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_shared, None)
    if shared is not None:
        shared.close()
    folder = config.stash.get(_folder, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
