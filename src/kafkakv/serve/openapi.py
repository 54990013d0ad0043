"""The OpenAPI 3.1 description of the HTTP API, served at ``GET /v1/openapi.json``.

Written as data rather than derived from the handlers: the API is small, and
``tests/serve/test_openapi.py`` checks that every route of the application appears here with
its methods, and that the answers the tests receive have statuses listed here.
"""

from __future__ import annotations

import functools
from typing import Any

from kafkakv import __version__
from kafkakv.serve.errors import CODES

__all__ = ["openapi_document"]

_JSON = "application/json"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": sorted(CODES)},
                "message": {"type": "string"},
            },
        }
    },
}

_ITEM = {
    "type": "object",
    "required": ["key"],
    "properties": {"key": {"type": "string"}, "value": {}},
}
_OFFSETS = {"type": "object", "additionalProperties": {"type": "integer"}}


def _param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


_NAME = {"type": "string", "pattern": "^[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,242}$"}
"""A topic name Kafka takes, with room for the ``_flush`` a map's third topic adds."""
_CURSOR = {"type": "string", "pattern": "^[0-9]+:[0-9]+(\\+[0-9]+)?(,[0-9]+:[0-9]+(\\+[0-9]+)?)*$"}
"""A change-feed cursor: partition:offset pairs, ``+n`` for changes taken inside a record."""
_MAP = _param("map", "path", "The map's name (its data topic).", _NAME)
_DIRECTORY = _param("name", "path", "The directory's topic.", _NAME)
_KEY = _param("key", "path", "The key's text form, percent-encoded.", {"type": "string"})
_CONSISTENCY = _param(
    "consistency",
    "query",
    "local (the default): the replica's state; linearizable: after a barrier.",
    {"type": "string", "enum": ["local", "linearizable"]},
)
_SCAN = [
    _param("prefix", "query", "Keys whose text starts with this.", {"type": "string"}),
    _param("start", "query", "The first key (inclusive).", {"type": "string"}),
    _param("end", "query", "The key to stop before (exclusive).", {"type": "string"}),
    _param("cursor", "query", "The `next` of the page before.", {"type": "string"}),
    _param(
        "limit",
        "query",
        "Keys per page.",
        {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    ),
    _param("values", "query", "false: keys only.", {"type": "boolean", "default": True}),
]


def _answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Bad input: a key, value, body or parameter that does not parse.",
        401: "A bearer token is required.",
        404: "No such map, directory, key or route.",
        405: "Method not allowed.",
        408: "The body did not arrive within the request timeout.",
        409: "A condition did not hold.",
        410: "The cursor's changes are no longer in the log.",
        413: "The body is too large.",
        422: "The update was decided as failed.",
        500: "A stored value that does not decode, or an unexpected error.",
        503: "The log is unreachable, the server is draining, or a directory is loading.",
        504: "The log did not answer within the request timeout.",
    }
    return {str(s): _answer(meaning[s], _ERROR) for s in statuses}


_ALWAYS = (401, 500, 503, 504)


def _op(
    summary: str,
    ok: dict[str, Any],
    errors: tuple[int, ...] = (),
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {**ok, **_errors(*sorted(set(errors) | set(_ALWAYS)))},
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {_JSON: {"schema": body}}}
    return op


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The description, built once."""
    key_value = {"type": "object", "properties": {"key": {"type": "string"}, "value": {}}}
    previous = {"type": "object", "properties": {"key": {"type": "string"}, "previous": {}}}
    page = {
        "type": "object",
        "required": ["items", "next"],
        "properties": {
            "items": {"type": "array", "items": _ITEM},
            "next": {"type": ["string", "null"]},
        },
    }
    batch = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": _ITEM},
            "missing": {"type": "array", "items": {"type": "string"}},
        },
    }
    keys_body = {
        "type": "object",
        "required": ["keys"],
        "additionalProperties": False,
        "properties": {"keys": {"type": "array", "maxItems": 1000, "items": {"type": "string"}}},
    }
    status = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "partitions": {"type": "integer"},
            "positions": _OFFSETS,
            "end_offsets": _OFFSETS,
            "lag": _OFFSETS,
        },
    }
    paths: dict[str, Any] = {
        "/v1/health": {
            "get": {
                "summary": "Whether the server takes requests.",
                "responses": {
                    "200": _answer("Serving.", {"type": "object"}),
                    **_errors(503),
                },
            }
        },
        "/v1/openapi.json": {"get": _op("This description.", {"200": _answer("OpenAPI 3.1")})},
        "/v1/maps": {
            "get": _op(
                "The maps in the log.",
                {"200": _answer("The maps.", {"type": "object"})},
            )
        },
        "/v1/maps/{map}": {
            "parameters": [_MAP],
            "get": _op("A map's status.", {"200": _answer("Its status.", status)}, (404,)),
            "put": _op(
                "Create a map.",
                {
                    "200": _answer("It existed with these settings.", {"type": "object"}),
                    "201": _answer("Created.", {"type": "object"}),
                },
                (400, 408, 409, 413),
                body={
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "partitions": {"type": ["integer", "null"], "minimum": 1, "maximum": 256},
                        "versions": {"type": "boolean"},
                        "expiry": {"type": "boolean"},
                        "hash_tags": {"type": "boolean"},
                    },
                },
            ),
        },
        "/v1/maps/{map}/keys": {
            "parameters": [_MAP],
            "get": _op(
                "A range scan in key order, a page at a time.",
                {"200": _answer("One page.", page)},
                (400, 404),
                [*_SCAN, _CONSISTENCY],
            ),
        },
        "/v1/maps/{map}/keys/{key}": {
            "parameters": [_MAP, _KEY],
            "get": _op(
                "Read one key.",
                {"200": _answer("Its value (and version).", key_value)},
                (400, 404),
                [_CONSISTENCY],
            ),
            "put": _op(
                "Write one key; the body is the JSON value.",
                {"200": _answer("Written.", previous)},
                (400, 404, 408, 409, 413, 422),
                [
                    _param("if_absent", "query", "Only if absent.", {"type": "boolean"}),
                    _param(
                        "ttl", "query", "Seconds to live (maps with expiry).", {"type": "number"}
                    ),
                ],
                body={},
            ),
            "delete": _op(
                "Remove one key.",
                {"200": _answer("Removed.", previous)},
                (400, 404),
            ),
        },
        "/v1/maps/{map}/keys/{key}/cas": {
            "parameters": [_MAP, _KEY],
            "post": _op(
                "Compare-and-set: expected null means absent.",
                {"200": _answer("Set.", key_value)},
                (400, 404, 408, 409, 413, 422),
                body={
                    "type": "object",
                    "required": ["expected", "value"],
                    "additionalProperties": False,
                    "properties": {"expected": {}, "value": {"not": {"type": "null"}}},
                },
            ),
        },
        "/v1/maps/{map}/get": {
            "parameters": [_MAP],
            "post": _op(
                "Read many keys.",
                {"200": _answer("Found and missing keys.", batch)},
                (400, 404, 408, 413),
                [_CONSISTENCY],
                keys_body,
            ),
        },
        "/v1/maps/{map}/put": {
            "parameters": [_MAP],
            "post": _op(
                "Write many keys: one log record per partition.",
                {"200": _answer("Written.", {"type": "object"})},
                (400, 404, 408, 413, 422),
                body={
                    "type": "object",
                    "required": ["items"],
                    "additionalProperties": False,
                    "properties": {
                        "items": {
                            "oneOf": [
                                {
                                    "type": "object",
                                    "additionalProperties": {"not": {"type": "null"}},
                                },
                                {
                                    "type": "array",
                                    "items": {
                                        "type": "array",
                                        "prefixItems": [
                                            {"type": "string"},
                                            {"not": {"type": "null"}},
                                        ],
                                        "minItems": 2,
                                        "maxItems": 2,
                                    },
                                },
                            ]
                        }
                    },
                },
            ),
        },
        "/v1/maps/{map}/transaction": {
            "parameters": [_MAP],
            "post": _op(
                "Conditional writes of one partition's keys, all or nothing.",
                {"200": _answer("Committed.", {"type": "object"})},
                (400, 404, 408, 409, 413, 422),
                body={
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "expect": {"type": "object"},
                        "expect_version": {
                            "type": "object",
                            "additionalProperties": {"type": ["integer", "null"]},
                        },
                        "put": {
                            "type": "object",
                            "additionalProperties": {"not": {"type": "null"}},
                        },
                        "remove": {"type": "array", "items": {"type": "string"}},
                    },
                    "anyOf": [
                        {"required": ["put"], "properties": {"put": {"minProperties": 1}}},
                        {"required": ["remove"], "properties": {"remove": {"minItems": 1}}},
                    ],
                },
            ),
        },
        "/v1/maps/{map}/changes": {
            "parameters": [_MAP],
            "get": {
                "summary": "Changes as Server-Sent Events, from a cursor.",
                "parameters": [
                    _param(
                        "since",
                        "query",
                        "A cursor (else Last-Event-ID, else now).",
                        _CURSOR,
                    ),
                    _param(
                        "Last-Event-ID",
                        "header",
                        "The id of the last event received.",
                        _CURSOR,
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "An event stream.",
                        "content": {"text/event-stream": {}},
                    },
                    **_errors(400, 401, 404, 410, 500, 503, 504),
                },
            },
        },
        "/v1/directories": {
            "get": _op(
                "Directories served, and topics that can be opened as one.",
                {"200": _answer("The directories.", {"type": "object"})},
            )
        },
        "/v1/directories/{name}": {
            "parameters": [_DIRECTORY],
            "get": _op("A directory's status.", {"200": _answer("Its status.", status)}, (404,)),
        },
        "/v1/directories/{name}/keys": {
            "parameters": [_DIRECTORY],
            "get": _op(
                "A range scan in key order.", {"200": _answer("One page.", page)}, (400, 404), _SCAN
            ),
        },
        "/v1/directories/{name}/keys/{key}": {
            "parameters": [_DIRECTORY, _KEY],
            "get": _op("Read one key.", {"200": _answer("Its value.", key_value)}, (400, 404)),
        },
        "/v1/directories/{name}/get": {
            "parameters": [_DIRECTORY],
            "post": _op(
                "Read many keys.",
                {"200": _answer("Found and missing keys.", batch)},
                (400, 404, 408, 413),
                body=keys_body,
            ),
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics of the open maps and directories.",
                {"200": {"description": "Prometheus text format."}},
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kafkakv",
            "version": __version__,
            "description": "Replicated maps and directories over HTTP: docs/serve.md.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": paths,
    }
