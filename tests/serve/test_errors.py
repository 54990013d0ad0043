"""The one table from kafkakv's errors to HTTP answers, and the codes' statuses."""

from __future__ import annotations

import pytest

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    CrossPartitionError,
    CursorError,
    DecodeError,
    EncodeError,
    LogAuthenticationError,
    LogUnavailableError,
    OperationFailedError,
    OperationTimeoutError,
    TopicMismatchError,
    UnknownMapError,
    UnknownTopicError,
)
from kafkakv.serve.errors import CODES, ApiError, api_error


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (LogUnavailableError("no leader"), 503, "unavailable"),
        (LogAuthenticationError("bad password"), 503, "unavailable"),
        (OperationTimeoutError("slow"), 504, "timeout"),
        (TimeoutError(), 504, "timeout"),
        (ClosedError("closed"), 503, "draining"),
        (UnknownMapError("m"), 404, "map_not_found"),
        (UnknownTopicError("t"), 404, "map_not_found"),
        (CursorError("bad"), 400, "bad_cursor"),
        (CrossPartitionError("two", {0: ["a"], 1: ["b"]}), 400, "cross_partition"),
        (TopicMismatchError("other settings"), 409, "settings_mismatch"),
        (EncodeError("not a str"), 400, "invalid_value"),
        (ConfigError("bad"), 400, "invalid_value"),
        (OperationFailedError("refused"), 422, "operation_failed"),
        (DecodeError("garbage"), 500, "undecodable"),
        (RuntimeError("bug"), 500, "internal"),
    ],
)
def test_each_error_gets_its_status_and_code(error: BaseException, status: int, code: str) -> None:
    answer = api_error(error)
    assert (answer.status, answer.code) == (status, code)
    assert answer.body()["error"]["code"] == code and answer.body()["error"]["message"]


def test_directory_routes_name_a_missing_directory() -> None:
    answer = api_error(UnknownTopicError("t"), missing="directory_not_found")
    assert (answer.status, answer.code) == (404, "directory_not_found")


def test_a_code_is_only_ever_answered_with_its_status() -> None:
    assert all(400 <= status < 600 for status in CODES.values())
    with pytest.raises(ValueError, match="does not go with"):
        ApiError(400, "timeout", "a timeout is a 504")
