"""What the types of maps promise, checked by running ``mypy --strict`` on small scripts.

Each script marks the lines where mypy must report an error (``# error: code``) and what
``reveal_type`` must say (``# reveal: type``); every other line must pass. All scripts are
checked in one mypy run against the kafkakv these tests import. The run-time half follows:
what the typed signatures accept works on a real map, and what they refuse fails there too.
"""

from __future__ import annotations

import doctest
import inspect
import os
import pickle
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mypy import api

import kafkakv
import kafkakv.codecs
import kafkakv.functions
from kafkakv import functions
from kafkakv.db import _Options
from kafkakv.errors import ConfigError, UnknownFunctionError
from tests.map.conftest import OpenMap

SCRIPTS = {
    "typed_codecs": """
        from typing import Any
        import kafkakv
        from kafkakv.codecs import Codec, IntCodec, PickleCodec, codec_for

        def use(db: kafkakv.Database, name: str) -> None:
            reveal_type(db.map("a"))  # reveal: ReplicaMap[str, Any]
            reveal_type(db.map("a", value_codec="int"))  # reveal: ReplicaMap[str, int]
            reveal_type(db.map("a", key_codec="bytes", value_codec="str"))  # reveal: ReplicaMap[bytes, str]
            reveal_type(db.map("a", key_codec="int", value_codec="bytes"))  # reveal: ReplicaMap[int, bytes]
            reveal_type(db.map("a", key_codec="int", timeout=5.0))  # reveal: ReplicaMap[int, Any]
            reveal_type(db.map("a", value_codec=IntCodec()))  # reveal: ReplicaMap[str, int]
            reveal_type(db.map("a", key_codec=codec_for("int"), value_codec=codec_for("str")))  # reveal: ReplicaMap[int, str]
            reveal_type(db.map("a", value_codec="json"))  # reveal: ReplicaMap[str, Any]
            reveal_type(db.map("a", value_codec="msgpack"))  # reveal: ReplicaMap[str, Any]
            reveal_type(db.map("a", value_codec=PickleCodec(trusted=True)))  # reveal: ReplicaMap[str, Any]
            reveal_type(db.map("a", key_codec="json", value_codec="int"))  # reveal: ReplicaMap[Any, int]
            reveal_type(db.map("a", key_codec=name, value_codec=name))  # reveal: ReplicaMap[Any, Any]
            reveal_type(db.sorted_map("s"))  # reveal: SortedReplicaMap[str, Any]
            reveal_type(db.sorted_map("s", key_codec="int", value_codec="str", store="lmdb"))  # reveal: SortedReplicaMap[int, str]
            reveal_type(codec_for("int"))  # reveal: IntCodec
            reveal_type(codec_for("json"))  # reveal: Codec[Any]
            lists: kafkakv.ReplicaMap[str, list[int]] = db.map("lists")
            reveal_type(lists)  # reveal: ReplicaMap[str, list[int]]
            options: dict[str, Any] = {"store": "dict"}
            reveal_type(db.map("a", **options))  # reveal: ReplicaMap[Any, Any]
            db.map("a", timeout="soon")  # error: call-overload
            db.map("a", key_codec=3)  # error: call-overload
    """,
    "bad_puts": """
        import kafkakv

        def use(db: kafkakv.Database) -> None:
            counts = db.map("counts", value_codec="int")
            counts["a"] = 1
            counts.put("b", 2)
            counts["a"] = "one"  # error: assignment
            counts.put("b", "two")  # error: arg-type
            counts.put_async("c", b"3")  # error: arg-type
            counts.put_all({"d": "4"})  # error: arg-type
            counts[1] = 1  # error: index
            total: int = counts["a"] + counts.get("b", 0)
            name: str = counts["a"]  # error: assignment
            by_id = db.sorted_map("by-id", key_codec="int", value_codec="str")
            by_id[7] = "seven"
            by_id["7"] = "seven"  # error: index
            low: int | None = by_id.first_key()
    """,
    "futures": """
        import asyncio
        import kafkakv

        def use(db: kafkakv.Database) -> None:
            m = db.map("m", value_codec="int")
            reveal_type(m.put_async("a", 1))  # reveal: OpFuture[int | None]
            reveal_type(m.put_async("a", 1).result())  # reveal: int | None
            reveal_type(m.put_if_absent_async("a", 1))  # reveal: OpFuture[int | None]
            reveal_type(m.replace_async("a", 1))  # reveal: OpFuture[int | None]
            reveal_type(m.remove_async("a"))  # reveal: OpFuture[int | None]
            reveal_type(m.compare_and_set_async("a", 1, 2))  # reveal: OpFuture[bool]
            reveal_type(m.remove_if_async("a", 1))  # reveal: OpFuture[bool]
            reveal_type(m.put_all_async({"a": 1}))  # reveal: OpFuture[int]
            reveal_type(m.remove_all_async(["a"]))  # reveal: OpFuture[int]
            s: str | None = m.put_async("a", 1).result()  # error: assignment

        async def wait(db: kafkakv.Database) -> None:
            m = db.map("m", key_codec="bytes", value_codec="str")
            reveal_type(await m.put_async(b"a", "x"))  # reveal: str | None
            reveal_type(await asyncio.wrap_future(m.put_all_async({b"a": "x"})))  # reveal: int
    """,
    "functions": """
        from typing import Any
        import kafkakv
        from kafkakv import functions

        @functions.register("typing-add")
        def add(key: str, old: int | None, n: int) -> int:
            return (old or 0) + n

        @functions.register("typing-join")
        def join(old: str, new: str) -> str | None:
            return old + new

        def untyped(key: Any, old: Any) -> Any:
            return old

        anything = functions.register("typing-any")(untyped)

        def use(db: kafkakv.Database) -> None:
            reveal_type(add)  # reveal: RegisteredFunction[[key: str, old: int | None, n: int], int]
            counts = db.map("counts", value_codec="int")
            texts = db.map("texts", value_codec="str")
            reveal_type(counts.compute("a", add, 1))  # reveal: int | None
            reveal_type(counts.compute("a", "typing-add", 1))  # reveal: int | None
            reveal_type(counts.compute_async("a", add, 1))  # reveal: OpFuture[int | None]
            counts.compute("a", anything)
            texts.merge("a", "x", join)
            texts.merge_async("a", "x", "typing-join")
            counts.compute("a", lambda key, old: 1)  # error: arg-type
            counts.compute("a", untyped)  # error: arg-type
            counts.merge("a", 1, lambda old, new: old + new)  # error: arg-type
            texts.compute("a", add, 1)  # error: arg-type
            counts.merge("a", 1, join)  # error: arg-type
            plain: int = add("a", None, 2)
    """,
}

_MARK = re.compile(r"#\s*(error|reveal):\s*(.+?)\s*$")
_REPORT = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): (?P<kind>error|note): (?P<text>.*)$")
_QUALIFIED = re.compile(r"\b(?:[a-z_]+\.)+(?=[A-Za-z_]+\b)")


def _expected(text: str) -> tuple[set[tuple[int, str]], dict[int, str]]:
    """The errors (line, code) and reveals (line: type) a script's comments ask for."""
    errors, reveals = set(), {}
    for number, line in enumerate(text.splitlines(), 1):
        found = _MARK.search(line)
        if found and found.group(1) == "error":
            errors.add((number, found.group(2)))
        elif found:
            reveals[number] = found.group(2)
    return errors, reveals


class MypyRun:
    """What one mypy run said of each script: errors as (line, code), reveals as
    line: type (module prefixes dropped). (Errors in kafkakv itself are the project's
    mypy run's to find: here mypy finds kafkakv on the Python path, which silences them.)"""

    def __init__(self, output: str, names: list[str]) -> None:
        self.output = output
        self.errors: dict[str, set[tuple[int, str]]] = {n: set() for n in names}
        self.reveals: dict[str, dict[int, str]] = {n: {} for n in names}
        self.lines: dict[str, list[str]] = {n: [] for n in names}
        for line in output.splitlines():
            report = _REPORT.match(line)
            # The scripts are in the working directory, named as given; kafkakv's own files
            # come with their paths (kafkakv/functions.py is not the script functions.py).
            name = report["file"].removesuffix(".py") if report else None
            if report is None or name not in self.errors:
                continue
            number, text = int(report["line"]), report["text"]
            self.lines[name].append(line)
            if report["kind"] == "error":
                code = re.search(r"\[([a-z-]+)\]$", text)
                self.errors[name].add((number, code.group(1) if code else text))
            elif text.startswith("Revealed type is "):
                revealed = text.removeprefix("Revealed type is ").strip('"')
                self.reveals[name][number] = _QUALIFIED.sub("", revealed)


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MypyRun]:
    """Every script of SCRIPTS checked in one ``mypy --strict`` run, in a directory of its
    own (mypy looks for modules in the working directory), against the kafkakv imported
    here: its ``src`` and the repository's ``stubs`` come first on mypy's path."""
    root = tmp_path_factory.mktemp("typing")
    src = Path(kafkakv.__file__).resolve().parent.parent
    config = root / "mypy.ini"
    config.write_text(
        textwrap.dedent(f"""\
            [mypy]
            strict = True
            python_version = 3.11
            mypy_path = {src}:{src.parent / "stubs"}
            cache_dir = {root / "cache"}

            [mypy-confluent_kafka.*]
            implicit_reexport = True
            """)
    )
    files = []
    for name, text in SCRIPTS.items():
        path = root / f"{name}.py"
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        files.append(str(path))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        out, err, _ = api.run(["--config-file", str(config), "--show-error-codes", *files])
    assert not err, err
    yield MypyRun(out, list(SCRIPTS))


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_mypy_reports_exactly_the_marked_errors(mypy_run: MypyRun, name: str) -> None:
    expected, _ = _expected(textwrap.dedent(SCRIPTS[name]).lstrip("\n"))
    assert mypy_run.errors[name] == expected, "\n".join(mypy_run.lines[name])


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_reveal_type_says_what_the_codecs_say(mypy_run: MypyRun, name: str) -> None:
    _, expected = _expected(textwrap.dedent(SCRIPTS[name]).lstrip("\n"))
    assert mypy_run.reveals[name] == expected, "\n".join(mypy_run.lines[name])


def test_the_typed_options_are_the_options_of_map() -> None:
    """The overloads of ``map`` and ``sorted_map`` take ``**options: Unpack[_Options]``: a
    new option of map() must be added there too, with the same type."""
    parameters = inspect.signature(kafkakv.Database.map).parameters
    given = {
        n: p.annotation
        for n, p in parameters.items()
        if p.kind is p.KEYWORD_ONLY and n not in ("key_codec", "value_codec")
    }
    typed = {n: getattr(t, "__forward_arg__", t) for n, t in _Options.__annotations__.items()}
    assert given == typed


# -- what the signatures promise, at run time -------------------------------------------------
@pytest.fixture
def registered() -> Iterator[functions.RegisteredFunction[..., int | None]]:
    def add(key: str, old: int | None, n: int) -> int:
        return (old or 0) + n

    yield functions.register("typing-add")(add)
    functions.unregister("typing-add")


def test_a_registered_function_works_where_its_name_does(
    open_map: OpenMap, registered: functions.RegisteredFunction[..., int | None]
) -> None:
    m = open_map(value_codec="int")
    assert m.compute("a", registered, 2) == 2 and m.compute("a", "typing-add", 3) == 5
    assert m.compute_async("a", registered, 1).result(timeout=10) == 6
    assert m.merge("b", 4, registered.name) == 4
    assert registered("k", 1, 1) == 2
    assert inspect.signature(registered) == inspect.signature(registered.function)


def test_an_unregistered_callable_appends_nothing_and_says_so(open_map: OpenMap) -> None:
    m = open_map(value_codec="int")
    m["a"] = 1
    engine = m._engine
    end = engine.log.end_offset(engine.topics.ops, 0)  # not m.sync(): on Kafka it appends
    for fn in (lambda key, old: 1, functions.RegisteredFunction("typing-never", len)):
        with pytest.raises(UnknownFunctionError, match="register it"):
            m.compute("a", fn)  # type: ignore[arg-type]  # the lambda: what mypy refuses
        with pytest.raises(UnknownFunctionError):
            m.merge_async("a", 2, fn)  # type: ignore[arg-type]
    assert engine.log.end_offset(engine.topics.ops, 0) == end and m["a"] == 1


def test_a_registered_function_pickles_as_its_name(
    registered: functions.RegisteredFunction[..., int | None],
) -> None:
    data = pickle.dumps(registered)
    assert b"typing-add" in data and b"add" in data
    back = pickle.loads(data)
    assert isinstance(back, functions.RegisteredFunction)
    assert back.name == "typing-add" and back.function is registered.function
    functions.unregister("typing-add")
    with pytest.raises(UnknownFunctionError):  # unpickled where it is not registered
        pickle.loads(data)


def test_a_registered_function_unpickles_in_a_new_process_by_importing_its_module() -> None:
    """As a plain function would: the module that defines it registers it on import."""
    from tests.map import _workers

    data = pickle.dumps(_workers.add)
    program = "import pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); print(f.name, f(b'k', 2, 4, 0))"
    src = Path(kafkakv.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(Path(__file__).parents[2])])}
    done = subprocess.run(
        [sys.executable, "-c", program], input=data, capture_output=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["mp-add", "6"]


def test_registering_a_registered_function_registers_its_function(
    registered: functions.RegisteredFunction[..., int | None],
) -> None:
    again = functions.register("typing-add")(registered)  # the same function: no conflict
    assert again.function is registered.function
    assert functions.lookup("typing-add") is registered.function
    with pytest.raises(ConfigError, match="already registered"):
        functions.register("typing-add")(lambda key, old: 0)


@pytest.mark.parametrize("module", [kafkakv.functions, kafkakv.codecs])
def test_doctests(module: Any) -> None:
    failed, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failed == 0
