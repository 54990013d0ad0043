"""The HTTP API through a real client, on the embedded log and on Kafka: what each route
answers, that it changed what it says, and that other replicas see it."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient

import kafkakv
from kafkakv.map import ReplicaMap
from tests.serve.conftest import Served, events

Json = Any


def _replica(served: Served, name: str) -> ReplicaMap[Any, Any]:
    """The test's own replica of map ``name`` (another replica than the server's)."""
    return served.db.map(name, create=False)


def _error(answer: httpx.Response, status: int, code: str) -> dict[str, Json]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    body: dict[str, Json] = answer.json()["error"]
    assert body["code"] == code, body
    assert body["message"]
    return body


def test_put_get_delete_one_key_seen_by_another_replica(served: Served) -> None:
    name, http = served.map_name(), served.http
    assert http.put(f"/v1/maps/{name}/keys/ada", json={"n": 1}).json() == {
        "key": "ada",
        "previous": None,
    }
    assert http.get(f"/v1/maps/{name}/keys/ada").json() == {"key": "ada", "value": {"n": 1}}
    assert http.put(f"/v1/maps/{name}/keys/ada", json={"n": 2}).json()["previous"] == {"n": 1}
    other = _replica(served, name)
    other.sync()
    assert other["ada"] == {"n": 2}
    other.put("bob", [1, 2])  # written elsewhere: the server sees it after a barrier
    linear = http.get(f"/v1/maps/{name}/keys/bob", params={"consistency": "linearizable"})
    assert linear.json() == {"key": "bob", "value": [1, 2]}
    assert http.delete(f"/v1/maps/{name}/keys/ada").json() == {"key": "ada", "previous": {"n": 2}}
    _error(http.get(f"/v1/maps/{name}/keys/ada"), 404, "key_not_found")
    _error(http.delete(f"/v1/maps/{name}/keys/ada"), 404, "key_not_found")
    other.sync()
    assert "ada" not in other


def test_keys_are_percent_encoded_text(served: Served) -> None:
    name, http = served.map_name(), served.http
    for key in ("a/b", "é ü", "with?query", "x/cash", ""):
        path = f"/v1/maps/{name}/keys/" + httpx.URL("/" + key).raw_path.decode()[1:].replace(
            "?", "%3F"
        )
        assert http.put(path, json=key).status_code == 200, key
        assert http.get(path).json() == {"key": key, "value": key}
    other = _replica(served, name)
    other.sync()
    assert sorted(other) == sorted(["a/b", "é ü", "with?query", "x/cash", ""])
    # A path ending in /cas is the compare-and-set resource, whatever the method.
    refused = _error(http.get(f"/v1/maps/{name}/keys/a/cas"), 405, "method_not_allowed")
    assert refused and http.put(f"/v1/maps/{name}/keys/a/cas", json=1).headers["allow"] == "POST"


def test_put_if_absent_and_compare_and_set_answer_409_with_the_current_value(
    served: Served,
) -> None:
    name, http = served.map_name(), served.http
    url = f"/v1/maps/{name}/keys/k"
    assert http.put(url, params={"if_absent": "true"}, json=1).status_code == 200
    refused = _error(http.put(url, params={"if_absent": "true"}, json=2), 409, "key_exists")
    assert refused["current"] == 1
    assert http.post(f"{url}/cas", json={"expected": 1, "value": 3}).json() == {
        "key": "k",
        "value": 3,
    }
    failed = _error(http.post(f"{url}/cas", json={"expected": 1, "value": 4}), 409, "cas_failed")
    assert failed["current"] == 3
    absent = f"/v1/maps/{name}/keys/new"
    assert http.post(f"{absent}/cas", json={"expected": None, "value": 5}).status_code == 200
    assert http.get(absent).json()["value"] == 5
    assert http.get(url).json()["value"] == 3


def test_transactions_commit_fail_and_refuse_two_partitions(served: Served) -> None:
    name, http = served.map_name(), served.http
    other = _replica(served, name)
    keys = [f"k{i}" for i in range(20)]
    same = [k for k in keys if other.partition_of(k) == other.partition_of("k0")]
    apart = next(k for k in keys if other.partition_of(k) != other.partition_of("k0"))
    a, b = same[0], same[1]
    txn = f"/v1/maps/{name}/transaction"
    assert http.post(txn, json={"expect": {a: None}, "put": {a: 1, b: 2}}).json() == {
        "committed": True
    }
    _error(http.post(txn, json={"expect": {a: None}, "put": {a: 9}}), 409, "transaction_failed")
    assert http.post(txn, json={"expect": {a: 1}, "remove": [b]}).status_code == 200
    crossing = _error(http.post(txn, json={"put": {a: 1, apart: 2}}), 400, "cross_partition")
    assert sorted(k for ks in crossing["partitions"].values() for k in ks) == sorted([a, apart])
    other.sync()
    assert dict(other) == {a: 1}


def test_batch_get_and_put(served: Served) -> None:
    name, http = served.map_name(), served.http
    put = http.post(f"/v1/maps/{name}/put", json={"items": {f"k{i}": i for i in range(50)}})
    assert put.json() == {"count": 50}
    pairs = http.post(f"/v1/maps/{name}/put", json={"items": [["p", 1], ["q", 2]]})
    assert pairs.json() == {"count": 2}
    got = http.post(f"/v1/maps/{name}/get", json={"keys": ["k3", "nope", "q"]}).json()
    assert got == {
        "items": [{"key": "k3", "value": 3}, {"key": "q", "value": 2}],
        "missing": ["nope"],
    }
    other = _replica(served, name)
    other.sync()
    assert len(other) == 52


def test_range_scan_pages_through_every_key_once_in_order(served: Served) -> None:
    name, http = served.map_name(), served.http
    keys = [f"key-{i:04d}" for i in range(250)] + [f"other-{i}" for i in range(5)]
    http.post(f"/v1/maps/{name}/put", json={"items": {k: k.upper() for k in keys}})
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 100, "prefix": "key-"}
        if cursor is not None:
            params["cursor"] = cursor
        page = http.get(f"/v1/maps/{name}/keys", params=params).json()
        seen += [item["key"] for item in page["items"]]
        assert all(item["value"] == item["key"].upper() for item in page["items"])
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == sorted(k for k in keys if k.startswith("key-")) and pages == 3
    bounded = http.get(
        f"/v1/maps/{name}/keys", params={"start": "key-0010", "end": "key-0013", "values": "false"}
    ).json()
    assert bounded == {
        "items": [{"key": "key-0010"}, {"key": "key-0011"}, {"key": "key-0012"}],
        "next": None,
    }
    _error(http.get(f"/v1/maps/{name}/keys", params={"limit": 5000}), 400, "bad_request")


def test_errors_are_json_with_stable_codes(served: Served) -> None:
    name, http = served.map_name(), served.http
    url = f"/v1/maps/{name}/keys/k"
    _error(http.get("/v1/maps/no-such-map/keys/k"), 404, "map_not_found")
    _error(http.get("/v1/maps/bad name!/keys/k"), 404, "map_not_found")
    _error(http.put(url, content=b"{not json"), 400, "invalid_json")
    _error(http.put(url, content=b""), 400, "invalid_json")
    _error(http.put(url, content=b"null"), 400, "invalid_value")
    _error(http.put(url, content=b"x" * (2 << 20)), 413, "body_too_large")
    _error(http.get(url, params={"consistency": "eventual"}), 400, "bad_request")
    _error(http.post(f"{url}/cas", json={"value": 1}), 400, "bad_request")
    patch = http.request("PATCH", url)
    _error(patch, 405, "method_not_allowed")
    assert set(patch.headers["allow"].split(", ")) >= {"GET", "PUT", "DELETE"}
    _error(http.put(url, params={"ttl": "5"}, json=1), 409, "settings_mismatch")
    _error(http.get("/v1/nothing-here"), 404, "not_found")
    assert http.get(url).status_code == 404  # nothing was written by the refusals
    other = _replica(served, name)
    other.sync()
    assert len(other) == 0


def test_listing_and_status_of_maps(served: Served) -> None:
    name, http = served.map_name(), served.http
    http.put(f"/v1/maps/{name}/keys/a", json=1)
    listed = {m["name"]: m for m in http.get("/v1/maps").json()["maps"]}
    assert listed[name]["partitions"] == 2 and listed[name]["open"] is True
    status = http.get(f"/v1/maps/{name}").json()
    assert status["size"] == 1 and status["partitions"] == 2
    assert sum(status["positions"].values()) == 1 == sum(status["end_offsets"].values())
    assert status["lag"] == {"0": 0, "1": 0}
    assert status["codecs"] == {"key": "str", "value": "json"}
    assert status["stalled"] == {} and status["errors"] == []
    again = http.put(f"/v1/maps/{name}", json={"partitions": 2})
    assert again.status_code == 200 and again.json()["created"] is False
    _error(http.put(f"/v1/maps/{name}", json={"partitions": 3}), 409, "settings_mismatch")
    _error(http.put(f"/v1/maps/{name}", json={"versions": True}), 409, "settings_mismatch")
    assert http.put(f"/v1/maps/{name}", json={"versions": False}).status_code == 200
    assert "kafkakv_map" in http.get("/metrics").text


@pytest.mark.parametrize("served", ["kafka"], indirect=True)
def test_maps_are_listed_from_one_answer_and_a_deleted_map_is_left_out(served: Served) -> None:
    """The listing takes names and partition counts from one listing of the log (on Kafka,
    one metadata answer): it asks no map on its own, so a map that another client deletes
    cannot vanish between its name and its details (a shared cluster's cleanup once made the
    whole listing fail with 404 that way). A map deleted before the listing is absent."""
    kept, doomed = served.map_name(), f"m-{uuid.uuid4().hex[:10]}"
    with kafkakv.connect(served.target, timeout=30) as other:  # not the server's: uncached
        other.map(doomed, partitions=2)
        other.map(kept)
    assert doomed in {m["name"] for m in served.http.get("/v1/maps").json()["maps"]}
    admin = AdminClient({"bootstrap.servers": served.target.removeprefix("kafka://")})
    topics = [doomed, f"{doomed}_ops", f"{doomed}_flush"]
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()
    log = served.db.log

    def asked_alone(topic: str) -> int:
        raise AssertionError(f"the listing asked {topic!r} on its own")

    log.partitions = asked_alone  # type: ignore[method-assign]
    try:
        deadline = time.monotonic() + 30
        while True:  # metadata spreads: the brokers forget the topics one by one
            answer = served.http.get("/v1/maps")
            assert answer.status_code == 200, answer.text
            listed = {m["name"]: m["partitions"] for m in answer.json()["maps"]}
            if doomed not in listed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        del log.partitions
    assert doomed not in listed
    assert listed[kept] == served.db.log.partitions(kept)


def test_changes_stream_from_a_cursor_and_resume_with_last_event_id(served: Served) -> None:
    name, http = served.map_name(), served.http
    start = http.get(f"/v1/maps/{name}").json()["cursor"]
    for i in range(3):
        http.put(f"/v1/maps/{name}/keys/k{i}", json=i)
    url = f"{served.url}/v1/maps/{name}/changes"
    with httpx.stream("GET", url, params={"since": start}, timeout=30) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = events(stream.iter_lines(), 4)
    assert first[0]["event"] == "cursor" and first[0]["id"] == start
    changes = [json.loads(e["data"]) for e in first[1:]]
    assert [(c["key"], c["old"], c["new"]) for c in changes] == [
        ("k0", None, 0),
        ("k1", None, 1),
        ("k2", None, 2),
    ] or sorted(c["key"] for c in changes) == ["k0", "k1", "k2"]
    resume = first[2]["id"]  # after the second change
    seen_before = {json.loads(e["data"])["key"] for e in first[1:3]}
    http.put(f"/v1/maps/{name}/keys/k3", json=3)
    headers = {"Last-Event-ID": resume}
    with httpx.stream("GET", url, params={"since": start}, headers=headers, timeout=30) as stream:
        later = events(stream.iter_lines(), 3)
    assert later[0]["event"] == "cursor" and later[0]["id"] == resume
    keys = {json.loads(e["data"])["key"] for e in later[1:]}
    assert keys == {"k0", "k1", "k2", "k3"} - seen_before
    _error(http.get(f"/v1/maps/{name}/changes", params={"since": "nonsense"}), 400, "bad_cursor")


def test_a_live_change_arrives_while_the_stream_is_open(served: Served) -> None:
    name = served.map_name()
    url = f"{served.url}/v1/maps/{name}/changes"
    with httpx.stream("GET", url, timeout=30) as stream:
        lines = stream.iter_lines()
        assert events(lines, 1)[0]["event"] == "cursor"
        _replica(served, name).put("live", {"x": 1})  # another replica writes
        change = events(lines, 1)[0]
    assert change["event"] == "change"
    assert json.loads(change["data"])["key"] == "live"


def test_directories_list_status_and_keys(served: Served) -> None:
    topic = f"dir-{uuid.uuid4().hex[:8]}"
    log = served.db.log
    log.create_topic(topic, 1, {"cleanup.policy": "compact"})
    from kafkakv.log.base import Record

    log.append(topic, 0, [Record(b"a", b'{"v": 1}'), Record(b"b", b'{"v": 2}'), Record(b"c", b"{")])
    http = served.http
    listed = {d["name"]: d for d in http.get("/v1/directories").json()["directories"]}
    assert topic in listed and listed[topic]["open"] is False
    status: dict[str, Json] = {}
    for _ in range(200):
        status = http.get(f"/v1/directories/{topic}").json()
        if status["ready"]:
            break
        import time

        time.sleep(0.05)
    assert status["ready"] and status["size"] == 2 and len(status["errors"]) == 1
    assert http.get(f"/v1/directories/{topic}/keys/a").json() == {"key": "a", "value": {"v": 1}}
    _error(http.get(f"/v1/directories/{topic}/keys/zz"), 404, "key_not_found")
    page = http.get(f"/v1/directories/{topic}/keys").json()
    assert [i["key"] for i in page["items"]] == ["a", "b"]
    batch = http.post(f"/v1/directories/{topic}/get", json={"keys": ["b", "q"]}).json()
    assert batch == {"items": [{"key": "b", "value": {"v": 2}}], "missing": ["q"]}
    _error(http.get("/v1/directories/no-such-topic/keys/a"), 404, "directory_not_found")
    linear = http.get(f"/v1/directories/{topic}/keys/a", params={"consistency": "linearizable"})
    _error(linear, 400, "bad_request")


def test_openapi_describes_every_route(served: Served) -> None:
    doc = served.http.get("/v1/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    described = {
        (path, method)
        for path, ops in doc["paths"].items()
        for method in ops
        if method != "parameters"
    }
    from starlette.routing import Route

    from kafkakv.serve.app import create_app
    from kafkakv.serve.config import ServeConfig

    gate = create_app(ServeConfig("unused"))
    routes = {
        (route.path.replace("{key:path}", "{key}"), method.lower())
        for route in gate.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route) and route.path != "/"
        for method in set(route.methods or ()) - {"HEAD"}
    }
    assert routes - described == set()
    assert described - routes == set()


def test_the_fast_path_answers_as_the_routes_do(served: Served) -> None:
    """A query parameter sends a request past the fast path to the routes: both answers,
    for success and for each error, must be the same."""
    name, http = served.map_name(), served.http
    url = f"/v1/maps/{name}/keys/k"
    routed = {"if_absent": "false"}
    fast_put = http.put(url, json={"a": [1, "x"]})
    routed_put = http.put(url, params=routed, json={"a": [1, "x"]})
    assert fast_put.status_code == routed_put.status_code == 200
    assert fast_put.json()["previous"] is None and routed_put.json()["previous"] == {"a": [1, "x"]}
    fast_get = http.get(url)
    routed_get = http.get(url, params={"consistency": "local"})
    assert fast_get.status_code == routed_get.status_code == 200
    assert fast_get.content == routed_get.content
    assert fast_get.headers["content-type"] == routed_get.headers["content-type"]
    for body in (b"{oops", b"", b"null"):
        fast, slow = http.put(url, content=body), http.put(url, params=routed, content=body)
        assert (fast.status_code, fast.json()) == (slow.status_code, slow.json()), body
    absent = f"/v1/maps/{name}/keys/absent"
    assert http.get(absent).json() == http.get(absent, params={"consistency": "local"}).json()
    big = b"1" * (2 << 20)
    assert http.put(url, content=big).json() == http.put(url, params=routed, content=big).json()
