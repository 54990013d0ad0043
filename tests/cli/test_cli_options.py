"""The options every command group shares: the log is ``-p/--path`` or ``$KAFKAKV_LOG`` in
each group, and ``-t/--target`` and ``$KAFKAKV_TARGET`` (what ``kafkakv topics`` and
``init-existing`` took before) still work everywhere as aliases. Real embedded logs in
temporary directories, no mocks."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kafkakv
from kafkakv.cli.main import main
from kafkakv.log import EmbeddedLog, Record

UNSET: dict[str, str | None] = {"KAFKAKV_LOG": None, "KAFKAKV_TARGET": None}
"""Neither variable, whatever the environment of the test run."""

_LOG = "{log}"
"""Where a command's arguments take the option naming the log."""


@dataclass(frozen=True)
class Case:
    """A command of one group, run on the log of :func:`log_dir`."""

    args: tuple[str, ...]
    """With ``{log}`` where the option goes."""
    check: Callable[[Result, Path], None]
    missing_log: bool = False
    """Name a directory that does not exist (a command that would start Spark otherwise)."""


def _succeeds_with(fragment: str) -> Callable[[Result, Path], None]:
    def check(result: Result, log_dir: Path) -> None:
        assert result.exit_code == 0, (result.stdout, result.stderr)
        assert fragment in result.stdout, result.stdout

    return check


def _names_the_missing_log(result: Result, log_dir: Path) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert f"error: no log at {log_dir}" in result.stderr, result.stderr


CASES = {
    "log": Case(("log", _LOG, "topics"), _succeeds_with("plain")),
    "map": Case(("map", _LOG, "get", "m", "k"), _succeeds_with("1")),
    "directory": Case(
        ("directory", _LOG, "load", "plain", "--dump"),
        _succeeds_with(json.dumps({"key": "a", "value": "x"})),
    ),
    "pipeline": Case(
        ("pipeline", _LOG, "snapshot", "out", "--map", "m"),
        _names_the_missing_log,
        missing_log=True,
    ),
    "topics": Case(("topics", "verify", _LOG, "m"), _succeeds_with("ok: map 'm'")),
    "init-existing": Case(("init-existing", _LOG, "plain"), _succeeds_with("adopted 'plain'")),
}

SPELLINGS = {
    "-p": (["-p", _LOG], {}),
    "--path": (["--path", _LOG], {}),
    "KAFKAKV_LOG": ([], {"KAFKAKV_LOG": _LOG}),
    "-t (alias)": (["-t", _LOG], {}),
    "--target (alias)": (["--target", _LOG], {}),
    "KAFKAKV_TARGET (alias)": ([], {"KAFKAKV_TARGET": _LOG}),
}


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A log with map ``m`` ({"k": 1}) and ``plain``, a compacted topic no map owns."""
    path = tmp_path / "log"
    with kafkakv.connect(path, background_cleaner=False) as db:
        db.map("m")["k"] = 1
    with EmbeddedLog(path, background_cleaner=False) as lg:
        lg.create_topic("plain", 1, {"cleanup.policy": "compact"})
        lg.append("plain", 0, [Record(b"a", b'"x"')])
    return path


def _run(case: Case, flags: list[str], env: dict[str, str | None]) -> Result:
    """``kafkakv ARGS`` with ``flags`` in the option's place and ``env`` over UNSET."""
    args: list[str] = []
    for arg in case.args:
        args.extend(flags if arg == _LOG else [arg])
    return CliRunner().invoke(main, args, env={**UNSET, **env})


@pytest.mark.parametrize("spelling", SPELLINGS.keys())
@pytest.mark.parametrize("group", CASES.keys())
def test_every_group_takes_the_log_by_every_name(
    group: str, spelling: str, log_dir: Path, tmp_path: Path
) -> None:
    case = CASES[group]
    where = tmp_path / "nowhere" if case.missing_log else log_dir
    flags, env = SPELLINGS[spelling]
    result = _run(
        case,
        [str(where) if f == _LOG else f for f in flags],
        {name: str(where) for name in env},
    )
    case.check(result, where)


@pytest.mark.parametrize("group", CASES.keys())
def test_kafkakv_log_wins_over_the_alias_variable(
    group: str, log_dir: Path, tmp_path: Path
) -> None:
    case = CASES[group]
    where = tmp_path / "nowhere" if case.missing_log else log_dir
    other = tmp_path / "other"
    result = _run(case, [], {"KAFKAKV_LOG": str(where), "KAFKAKV_TARGET": str(other)})
    case.check(result, where)
    assert str(other) not in result.output


@pytest.mark.parametrize("group", CASES.keys())
def test_without_a_log_every_group_says_to_pass_path(group: str) -> None:
    result = _run(CASES[group], [], {})
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Usage:" in result.stderr
    assert "--path/-p" in result.stderr and "KAFKAKV_LOG" in result.stderr, result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [["log"], ["map"], ["directory"], ["pipeline"], ["topics", "create"], ["init-existing"]],
)
def test_help_shows_path_and_names_the_aliases(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"], env=UNSET)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # as wrapped for the terminal's width
    assert "-p, --path LOG" in text
    assert "-t/--target and KAFKAKV_TARGET are aliases" in text
    assert "--target LOG" not in text  # listed once, under its name
