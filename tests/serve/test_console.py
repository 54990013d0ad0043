"""The web console of ``kafkakv serve`` in a real browser: Debian's chromium, headless, driven
by Playwright, against a real ``kafkakv serve`` process on an embedded log, while other
processes write to that log through the Python API.

The console is ``src/kafkakv/serve/static/``; its element ids are what these tests rely on.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.serve.browsing import (
    ConsolePage,
    ServeProcess,
    png_pixels,
    start_serve,
    write_map,
    write_topic,
)

pytest_plugins = ["tests.serve._browser"]


def _name(what: str) -> str:
    """A map name unique to the test (every test of the module shares one log)."""
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _search(page: Page, prefix: str) -> list[str]:
    """Search the keys starting with ``prefix``; the keys the page lists once it has answered."""
    page.fill("#key-search", prefix)
    page.press("#key-search", "Enter")
    page.wait_for_selector(
        f"#key-list[data-prefix={json.dumps(prefix)}]:not([aria-busy])", state="attached"
    )
    keys = page.eval_on_selector_all("#key-list [data-key]", "bs => bs.map(b => b.dataset.key)")
    assert isinstance(keys, list)
    return [str(k) for k in keys]


def _view(page: Page, key: str) -> str:
    """Open ``key``'s value; its text as the page shows it."""
    page.locator(f"#key-list [data-key={json.dumps(key)}]").click()
    expect(page.locator("#value-key")).to_have_text(key)
    expect(page.locator("#value-view")).to_have_attribute("data-state", "value")
    return page.locator("#value-view").inner_text()


def _live(page: Page) -> None:
    """Wait until the page follows the selected map's changes (it has the stream's cursor)."""
    expect(page.locator("#changes-state")).to_have_attribute("data-state", "live")


def test_finds_a_key_another_process_wrote(
    console_server: ServeProcess, console: ConsolePage
) -> None:
    name = _name("found")
    odd = "alpha/b c?d#e%f"  # every character that must be percent-encoded in a path
    items = {
        "alpha:1": {"n": 1},
        "alpha:2": {"n": 2, "tags": ["x", "y"]},
        odd: "odd key",
        "beta:1": [1, 2, 3],
        **{f"page:{i:03d}": i for i in range(60)},
    }
    write_map(console_server.logdir, name, items, partitions=3)
    page = console.open(console_server)

    page.locator(f'[data-map="{name}"]').click()
    expect(page.locator("#selected-name")).to_have_text(name)
    # The status: one row per partition, with where the server's replica stands.
    expect(page.locator("#partitions tbody tr")).to_have_count(3)
    expect(page.locator("#partitions thead th")).to_have_text(
        ["partition", "position", "end offset", "lag", "last flush"]
    )
    offsets = page.locator("#partitions tbody tr").first.locator("td").all_inner_texts()
    assert offsets[0] == offsets[1] and offsets[2] == "0", offsets  # caught up: no lag
    expect(page.locator("#selected-summary")).to_contain_text("64 keys")

    assert _search(page, "alpha") == ["alpha/b c?d#e%f", "alpha:1", "alpha:2"]
    assert json.loads(_view(page, "alpha:2")) == {"n": 2, "tags": ["x", "y"]}
    assert json.loads(_view(page, odd)) == "odd key"

    # Paginated: a page of 50, then the rest after the cursor.
    assert _search(page, "page:") == [f"page:{i:03d}" for i in range(50)]
    page.click("#key-more")
    expect(page.locator("#key-list [data-key]")).to_have_count(60)
    expect(page.locator("#key-more")).to_be_hidden()
    assert _search(page, "nothing-here") == []
    expect(page.locator("#key-state")).to_contain_text("No key starts with")
    console.check_clean(console_server)


def test_a_live_change_arrives(console_server: ServeProcess, console: ConsolePage) -> None:
    name = _name("live")
    write_map(console_server.logdir, name, {"before": 0, "doomed": "bye"})
    page = console.open(console_server, f"map/{name}")
    _live(page)

    write_map(console_server.logdir, name, {"arrived": {"at": "now"}}, removed=("doomed",))
    written = time.monotonic()
    change = page.locator('#changes li[data-key="arrived"]')
    expect(change).to_be_visible(timeout=5_000)
    took = time.monotonic() - written
    assert took < 5.0, took
    expect(change).to_contain_text('{"at":"now"}')
    expect(change).to_have_attribute("data-kind", "added")
    expect(page.locator('#changes li[data-key="doomed"]')).to_have_attribute("data-kind", "removed")
    expect(page.locator('#changes li[data-key="before"]')).to_have_count(0)  # from now on

    # Paused, the page drops its stream; resumed, it reconnects with Last-Event-ID and gets
    # what was written meanwhile, once, and nothing it had already.
    page.click("#changes-pause")
    expect(page.locator("#changes-state")).to_have_attribute("data-state", "paused")
    write_map(console_server.logdir, name, {"while-paused": 1, "arrived": {"at": "later"}})
    page.click("#changes-pause")
    expect(page.locator('#changes li[data-key="while-paused"]')).to_have_count(1)
    expect(page.locator('#changes li[data-key="arrived"]')).to_have_count(2)
    expect(page.locator('#changes li[data-key="arrived"]').first).to_contain_text('{"at":"later"}')
    expect(page.locator('#changes li[data-key="doomed"]')).to_have_count(1)
    console.check_clean(console_server)


def test_a_directory_shows_readiness_errors_and_values(
    console_server: ServeProcess, console: ConsolePage
) -> None:
    topic = _name("table")
    records = {"row:1": b'{"city": "Lyon"}', "row:2": b'{"city": "Oslo"}', "broken": b"\xff{"}
    write_topic(console_server.logdir, topic, records)
    page = console.open(console_server)

    page.locator(f'#directories [data-directory="{topic}"]').click()
    expect(page.locator("#selected-kind")).to_have_text("Directory")
    expect(page.locator("#selected-summary")).to_have_attribute("data-ready", "true")
    expect(page.locator("#selected-summary")).to_contain_text("ready")
    expect(page.locator(f'#directories [data-directory="{topic}"]')).to_contain_text("ready")
    expect(page.locator("#partitions tbody tr")).to_have_count(1)
    # The record that is not JSON is an error at its offset, not a value.
    expect(page.locator("#errors li")).to_have_count(1)
    expect(page.locator("#errors li")).to_contain_text("offset 2")
    expect(page.locator("#changes-panel")).to_be_hidden()  # a directory has no change stream

    assert _search(page, "row:") == ["row:1", "row:2"]
    assert json.loads(_view(page, "row:2")) == {"city": "Oslo"}
    console.check_clean(console_server)


def test_screenshot_shows_the_console(
    console_server: ServeProcess, console: ConsolePage, tmp_path: Path
) -> None:
    name = _name("shot")
    write_map(console_server.logdir, name, {f"k{i}": {"i": i} for i in range(5)}, partitions=2)
    page = console.open(console_server, f"map/{name}")
    expect(page.locator(f'#maps [data-map="{name}"]')).to_be_visible()
    expect(page.locator(f'#maps [data-map="{name}"]')).to_contain_text(name)
    expect(page.locator("#key-list [data-key]")).to_have_count(5)
    expect(page.locator("#partitions tbody tr")).to_have_count(2)
    _live(page)
    assert json.loads(_view(page, "k2")) == {"i": 2}
    assert page.evaluate("document.body.dataset.state") == "ready"
    styled = "getComputedStyle(document.documentElement).getPropertyValue('--console-styled')"
    assert page.evaluate(styled).strip() == "1", "console.css was not applied"

    path = tmp_path / "console.png"
    page.screenshot(path=str(path))
    width, height, rows = png_pixels(path.read_bytes())
    assert (width, height) == (1100, 800)
    colours = {row[i : i + 4] for row in rows for i in range(0, len(row), 4)}
    # A blank or unstyled page has a handful of colours; text, the top bar, panels and badges
    # rendered anti-aliased have hundreds.
    assert len(colours) > 100, f"{len(colours)} colours in {path}"
    # The top bar (console.css: --top, #14213d) fills the first rows.
    assert rows[5][20:24] == bytes([0x14, 0x21, 0x3D, 0xFF]), rows[5][20:24]
    print(f"screenshot: {path}")
    console.check_clean(console_server)


def test_markup_in_values_and_keys_shows_as_text(
    console_server: ServeProcess, console: ConsolePage
) -> None:
    name = _name("markup")
    evil = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
    key = "<b>bold</b> key"
    write_map(console_server.logdir, name, {key: evil, "plain": {"html": evil}})
    page = console.open(console_server, f"map/{name}")
    _live(page)

    assert _search(page, "<b>") == [key]
    expect(page.locator("#key-list b")).to_have_count(0)
    assert json.loads(_view(page, key)) == evil
    expect(page.locator("#value-view")).to_contain_text("<img src=x onerror=")
    write_map(console_server.logdir, name, {"later": evil})
    expect(page.locator('#changes li[data-key="later"]')).to_contain_text("<script>")
    assert page.locator("#detail img, #detail script, #key-list b").count() == 0
    assert page.evaluate("window.pwned") is None
    console.check_clean(console_server)


def test_token_is_asked_for_and_kept(console: ConsolePage, tmp_path: Path) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    logdir = tmp_path / "log"
    logdir.mkdir()
    name = _name("secret")
    write_map(logdir, name, {"k": "v"})
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    server = start_serve(logdir, "--token-file", str(token_file))
    try:
        page = console.open(server)
        expect(page.locator("#token-form")).to_be_visible()
        expect(page.locator("#maps [data-map]")).to_have_count(0)
        assert page.evaluate("document.body.dataset.state") == "token"

        page.fill("#token-input", "not-the-token-at-all")
        page.click("#token-submit")
        expect(page.locator("#token-message")).to_contain_text("refused")
        expect(page.locator("#token-form")).to_be_visible()

        page.fill("#token-input", token)
        page.click("#token-submit")
        expect(page.locator(f'#maps [data-map="{name}"]')).to_be_visible()
        expect(page.locator("#token-form")).to_be_hidden()
        assert page.evaluate("sessionStorage.getItem('kafkakv.token')") == token

        # Kept for the tab: a reload asks for nothing, and the changes stream authenticates.
        page.reload()
        page.locator(f'[data-map="{name}"]').click()
        _live(page)
        assert _search(page, "") == ["k"]
        expect(page.locator("#token-form")).to_be_hidden()
        console.check_clean(server)
    finally:
        console.page.close()  # its change stream first: the server then stops at once
        server.stop()


def test_the_console_rides_out_a_server_restart(console: ConsolePage, tmp_path: Path) -> None:
    """The server stops (SIGTERM: its change streams end) and comes back on the same port: the
    page says it lost the server, then reconnects by itself and, resuming its stream with
    Last-Event-ID, shows what was written while the server was down, once."""
    logdir = tmp_path / "log"
    logdir.mkdir()
    name = _name("restart")
    write_map(logdir, name, {"first": 1})
    server = start_serve(logdir)
    try:
        page = console.open(server, f"map/{name}")
        _live(page)
        write_map(logdir, name, {"before-stop": 1})
        expect(page.locator('#changes li[data-key="before-stop"]')).to_have_count(1)

        server.stop()
        expect(page.locator("#connection")).to_have_attribute("data-state", "error")
        write_map(logdir, name, {"while-down": 2})
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        server = start_serve(logdir, port=port)

        expect(page.locator("#connection")).to_have_attribute("data-state", "ok")
        expect(page.locator('#changes li[data-key="while-down"]')).to_have_count(1)
        _live(page)
        write_map(logdir, name, {"after-restart": 3})
        expect(page.locator('#changes li[data-key="after-restart"]')).to_have_count(1)
        expect(page.locator('#changes li[data-key="before-stop"]')).to_have_count(1)
        expect(page.locator('#changes li[data-key="while-down"]')).to_have_count(1)
        # The browser logged the refused connections while the server was down: expected here.
        console.errors.clear()
        console.check_clean(server)
    finally:
        console.page.close()
        server.stop()


def test_event_stream_parser(console_server: ServeProcess, console: ConsolePage) -> None:
    """The console's own Server-Sent Events parser, run in the browser on awkward chunking:
    CR LF split across chunks, bare CR, comments, multi-line data, ids kept across events."""
    page = console.open(console_server)
    page.wait_for_selector("body[data-state=ready]")
    events = page.evaluate(
        """async () => {
          const { EventStreamParser } = await import("./static/events.js");
          const seen = [];
          const p = new EventStreamParser((e) => seen.push(e));
          const text = ": keep-alive\\r\\nevent: cursor\\r\\nid: 0:1\\r\\n\\r\\n" +
            "event: change\\rid: 0:2\\rdata: {\\"a\\":\\rdata:  1}\\r\\r" +
            "data: no id\\n\\nid\\nretry: 250\\ndata:x\\n\\n";
          for (let i = 0; i < text.length; i += 3) p.push(text.slice(i, i + 3));
          return { seen, retry: p.retry, last: p.lastEventId };
        }"""
    )
    assert events["seen"] == [
        {"type": "cursor", "data": "", "id": "0:1"},
        {"type": "change", "data": '{"a":\n 1}', "id": "0:2"},
        {"type": "message", "data": "no id", "id": "0:2"},
        {"type": "message", "data": "x", "id": ""},
    ]
    assert events["retry"] == 250
    assert events["last"] == ""


def test_status_shaping(console_server: ServeProcess, console: ConsolePage) -> None:
    """status.js, run in the browser on a map status as the server answers it, with a partition
    this replica stalled at: the table's columns and cells, the facts, the error lines."""
    page = console.open(console_server)
    page.wait_for_selector("body[data-state=ready]")
    shaped = page.evaluate(
        """async () => {
          const s = await import("./static/status.js");
          const status = {
            name: "m", partitions: 2, held: [0, 1], codecs: {key: "str", value: "json"},
            settings: {versions: false}, size: 3, cursor: "0:4,1:2",
            positions: {"0": 4, "1": 2}, end_offsets: {"0": 4, "1": 5},
            lag: {"0": 0, "1": 3}, flushed: {"0": 3, "1": -1},
            errors: [{partition: 1, offset: 2, topic: "m_ops", error: "no function 'f'"}],
            stalled: {"1": "missing function 'f'"},
          };
          const t = s.partitionTable(status);
          return {
            columns: t.columns.map(s.columnLabel),
            cells: t.rows.map((r) => t.columns.map((c) => s.cellText(c, r[c]))),
            facts: s.statusFacts(status, t.used),
            errors: s.errorLines(status),
            path: s.keyPath("a/b c?#%"),
          };
        }"""
    )
    assert shaped["columns"] == ["partition", "position", "end offset", "lag", "last flush"]
    assert shaped["cells"] == [["0", "4", "4", "0", "3"], ["1", "2", "5", "3", "none yet"]]
    assert shaped["facts"] == [
        ["held", "[0,1]"],
        ["codecs \u203a key", "str"],
        ["codecs \u203a value", "json"],
        ["settings \u203a versions", "false"],
        ["size", "3"],
        ["cursor", "0:4,1:2"],
    ]
    assert shaped["errors"] == [
        "partition 1 stalled: missing function 'f'",
        "topic m_ops, partition 1, offset 2: no function 'f'",
    ]
    assert shaped["path"] == "a%2Fb%20c%3F%23%25"
