"""The forwarding bases of tests/doubles.py keep up with the interfaces they stand for."""

from __future__ import annotations

import inspect

import pytest

from kafkakv.errors import ClosedError
from kafkakv.log import Log, LogWriter, MemoryLog, Record
from tests.doubles import ForwardingLog, ForwardingLogWriter


def _public(cls: type) -> dict[str, object]:
    """Every public attribute ``cls`` defines or inherits, below ``object``."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):
        found.update((n, v) for n, v in vars(klass).items() if not n.startswith("_"))
    return found


@pytest.mark.parametrize(
    ("interface", "double"), [(Log, ForwardingLog), (LogWriter, ForwardingLogWriter)]
)
def test_a_forwarding_double_overrides_every_method_with_its_exact_signature(
    interface: type, double: type
) -> None:
    assert not inspect.isabstract(double), sorted(getattr(double, "__abstractmethods__", ()))
    for name, member in _public(interface).items():
        if isinstance(member, property):
            assert isinstance(vars(double).get(name), property), f"{double.__name__}.{name}"
        elif callable(member):
            assert name in vars(double), f"{double.__name__} does not forward {name}()"
            ours = inspect.signature(getattr(double, name))
            assert ours == inspect.signature(member), f"{double.__name__}.{name}{ours}"


def test_a_forwarding_log_answers_as_its_inner_log_does() -> None:
    inner = MemoryLog()
    log = ForwardingLog(inner)
    for name, member in _public(Log).items():
        if not callable(member) and not isinstance(member, property):
            assert getattr(log, name) == getattr(inner, name), name  # class-level facts
    log.create_topic("t", 2, {"cleanup.policy": "compact"})
    assert log.topics() == inner.topics() == ["t"] and log.partitions("t") == 2
    assert log.topic_config("t") == inner.topic_config("t")
    assert log.new_topic_replication() == inner.new_topic_replication()
    assert log.append("t", 0, [Record(b"a", b"1")]) == 0
    log.send("t", 0, [Record(b"a", b"2")], None, timeout=1.0)
    with log.writer("w", timeout=1.0) as writer:
        assert isinstance(writer, LogWriter) and writer.transactional_id == "w"
        assert writer.append({("t", 1): [Record(b"b", b"3")]}, timeout=1.0) == {("t", 1): 0}
    assert log.read("t", 0, 0, max_records=1) == inner.read("t", 0, 0, max_records=1)
    assert log.read_batch("t", 0, 0) == inner.read_batch("t", 0, 0)
    assert log.read_entries("t", 0, 0) == inner.read_entries("t", 0, 0)
    assert log.read_latest("t", 0, 0) == inner.read_latest("t", 0, 0)
    assert (log.start_offset("t", 0), log.end_offset("t", 0)) == (0, 2)
    assert log.wait("t", 1, 0, 0) and log.wait_any({("t", 1): 1}, 0) == set()
    assert [r.records_out for r in log.compact("t")] == [1, 1]
    assert log.check() == []
    log.close()
    with pytest.raises(ClosedError):
        inner.topics()
