"""The public surface of the package."""

from __future__ import annotations

import importlib
import pkgutil

import kafkakv
import kafkakv.directory
import kafkakv.errors
import kafkakv.log


def test_all_is_explicit_and_every_name_exists() -> None:
    for module in (kafkakv, kafkakv.log, kafkakv.errors, kafkakv.directory):
        names = list(module.__all__)
        assert names == sorted(names), f"{module.__name__}.__all__ is not sorted"
        assert len(set(names)) == len(names), f"{module.__name__}.__all__ repeats a name"
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.__all__ names missing {name}"
    assert {"EmbeddedLog", "Record", "KafkaKVError", "partition_for"} <= set(kafkakv.__all__)
    assert {"EmbeddedLog", "MemoryLog", "Log", "Record"} <= set(kafkakv.log.__all__)
    assert {"Directory", "DirectoryRecord", "RecordError", "metrics"} <= set(kafkakv.__all__)


def test_every_module_imports_and_declares_all() -> None:
    for info in pkgutil.walk_packages(kafkakv.__path__, "kafkakv."):
        module = importlib.import_module(info.name)
        if info.name.endswith("__main__"):
            continue
        assert hasattr(module, "__all__") or info.ispkg or info.name.endswith(".main"), info.name


def test_errors_share_one_root_and_keep_builtin_meaning() -> None:
    errors = [getattr(kafkakv.errors, n) for n in kafkakv.errors.__all__]
    assert all(issubclass(e, kafkakv.errors.KafkaKVError) for e in errors)
    assert issubclass(kafkakv.errors.InvalidRecordError, TypeError)
    assert issubclass(kafkakv.errors.ConfigError, ValueError)
    assert issubclass(kafkakv.errors.UnknownTopicError, KeyError)
    assert issubclass(kafkakv.errors.OperationTimeoutError, TimeoutError)
    assert issubclass(kafkakv.errors.LogIOError, OSError)
    # The docstring draws the hierarchy: every class appears in it.
    doc = kafkakv.errors.__doc__ or ""
    assert all(n in doc for n in kafkakv.errors.__all__)


def test_the_dev_tooling_errors_live_with_the_dev_tooling() -> None:
    import kafkakv.dev.errors

    dev_errors = set(kafkakv.dev.errors.__all__)
    assert dev_errors == {
        "ClockShimError",
        "ClusterError",
        "HostsError",
        "JarFetchError",
        "PostgresError",
    }
    assert not dev_errors & set(kafkakv.errors.__all__)
    assert not any(hasattr(kafkakv.errors, name) for name in dev_errors)
    for name in dev_errors:  # still under the one root, so the CLI reports them
        assert issubclass(getattr(kafkakv.dev.errors, name), kafkakv.errors.KafkaKVError)
