"""The errors of the HTTP API: :class:`ApiError`, and :func:`api_error`, which turns any error
kafkakv raises into one.

Every error answer is ``{"error": {"code": ..., "message": ...}}`` (plus fields of its own,
such as ``current`` for a failed compare-and-set) with a stable code and its HTTP status; the
table is in docs/serve.md, "Errors". The mapping below is the one place that decides which
kafkakv error gets which status.
"""

from __future__ import annotations

from typing import Any

from kafkakv.errors import (
    ClosedError,
    ConfigError,
    CrossPartitionError,
    CursorError,
    CursorExpiredError,
    DecodeError,
    EncodeError,
    KafkaKVError,
    LogAuthenticationError,
    LogUnavailableError,
    OperationFailedError,
    OperationTimeoutError,
    PartitionStalledError,
    RecordTooLargeError,
    TopicMismatchError,
    UnknownMapError,
    UnknownTopicError,
)

__all__ = ["CODES", "ApiError", "api_error"]

CODES: dict[str, int] = {
    "bad_request": 400,
    "invalid_json": 400,
    "invalid_key": 400,
    "invalid_value": 400,
    "bad_cursor": 400,
    "cross_partition": 400,
    "unauthorized": 401,
    "not_found": 404,
    "map_not_found": 404,
    "directory_not_found": 404,
    "key_not_found": 404,
    "method_not_allowed": 405,
    "body_timeout": 408,
    "key_exists": 409,
    "cas_failed": 409,
    "transaction_failed": 409,
    "settings_mismatch": 409,
    "cursor_expired": 410,
    "body_too_large": 413,
    "operation_failed": 422,
    "internal": 500,
    "undecodable": 500,
    "unavailable": 503,
    "draining": 503,
    "not_ready": 503,
    "stalled": 503,
    "timeout": 504,
}
"""Every error code the API answers with, and its status."""


class ApiError(Exception):
    """An error answer: ``status``, stable ``code``, a message for people, ``extra`` fields
    that go into the body beside them, and ``headers`` of the answer (``Allow``...)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        extra: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if CODES.get(code) != status:  # a programming error: the table is the contract
            raise ValueError(f"error code {code!r} does not go with status {status}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


def api_error(exc: BaseException, *, missing: str = "map_not_found") -> ApiError:
    """The answer to ``exc``, raised while serving a request; ``missing`` is the code for
    an unknown map or topic (``directory_not_found`` on directory routes).

    >>> api_error(OperationTimeoutError("slow")).status
    504
    >>> api_error(CursorExpiredError("gone", partition=0, flushed=9)).code
    'cursor_expired'
    """
    if isinstance(exc, ApiError):
        return exc
    message = str(exc) or type(exc).__name__
    if isinstance(exc, UnknownMapError | UnknownTopicError):
        return ApiError(404, missing, message)
    if isinstance(exc, OperationTimeoutError | TimeoutError):
        return ApiError(504, "timeout", message or "the log did not answer in time")
    if isinstance(exc, LogUnavailableError | LogAuthenticationError):
        return ApiError(503, "unavailable", message)
    if isinstance(exc, ClosedError):
        return ApiError(503, "draining", message)
    if isinstance(exc, PartitionStalledError):
        return ApiError(503, "stalled", message)
    if isinstance(exc, CursorExpiredError):
        return ApiError(410, "cursor_expired", message)
    if isinstance(exc, CursorError):
        return ApiError(400, "bad_cursor", message)
    if isinstance(exc, CrossPartitionError):
        partitions = {str(p): [repr(k) for k in keys] for p, keys in exc.partitions.items()}
        return ApiError(400, "cross_partition", message, {"partitions": partitions})
    if isinstance(exc, TopicMismatchError):
        return ApiError(409, "settings_mismatch", message)
    if isinstance(exc, EncodeError | RecordTooLargeError | ConfigError):
        return ApiError(400, "invalid_value", message)
    if isinstance(exc, OperationFailedError):
        return ApiError(422, "operation_failed", message)
    if isinstance(exc, DecodeError):
        return ApiError(500, "undecodable", message)
    if isinstance(exc, KafkaKVError):
        return ApiError(500, "internal", f"{type(exc).__name__}: {message}")
    return ApiError(500, "internal", f"{type(exc).__name__}: {message}")
