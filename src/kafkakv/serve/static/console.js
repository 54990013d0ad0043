// The kafkakv web console: plain JavaScript modules, no build step, nothing fetched from
// elsewhere. This one is the page and its network; events.js parses the change stream and
// status.js turns answers into rows and text (both pure).
//
// It reads the server's JSON API (docs/serve.md) with fetch() and follows a map's changes with
// a streamed fetch() of its Server-Sent Events, so that every request can carry the bearer
// token. Text from the server only ever reaches the page through textContent or attributes
// set one by one: a key or value holding markup shows as that markup's text.

import { EventStreamParser } from "./events.js";
import {
  cellText,
  columnLabel,
  errorLines,
  keyPath,
  keyText,
  partitionTable,
  statusFacts,
  valueText,
} from "./status.js";

const REFRESH_MS = 2000;
const KEY_PAGE = 50;
const MAX_CHANGES = 500;
const TOKEN_KEY = "kafkakv.token";
const RETRY_MIN_MS = 500;
const RETRY_MAX_MS = 5000;

// ---------------------------------------------------------------------------------------------
// The network: every request goes through api() or a ChangeStream, which add the token.

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let token = sessionStorage.getItem(TOKEN_KEY);
let tokenWaiters = [];

function headers(extra = {}) {
  const h = { Accept: "application/json", ...extra };
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code ?? code;
      message = body.error.message ?? message;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, code, message);
}

async function api(path, { signal } = {}) {
  const sentWith = token;
  let response;
  try {
    response = await fetch(path, { headers: headers(), cache: "no-store", signal });
  } catch (exc) {
    if (signal && signal.aborted) throw exc;
    throw new ApiError(0, "unreachable", "the server does not answer");
  }
  if (response.status === 401) {
    askForToken(sentWith);
    throw await errorOf(response);
  }
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** Resolves once a token has been entered (at once when none is awaited). */
function tokenGiven() {
  if (!state.awaitingToken) return Promise.resolve();
  return new Promise((resolve) => tokenWaiters.push(resolve));
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** Follows a map's changes until stop(): reconnects after any failure with Last-Event-ID,
 *  so that nothing is missed or seen twice; pause() drops the connection but keeps the place. */
class ChangeStream {
  constructor(map, { onChange, onState, onNote }) {
    this.map = map;
    this.onChange = onChange;
    this.onState = onState;
    this.onNote = onNote;
    this.lastId = null;
    this.stopped = false;
    this.paused = false;
    this.controller = null;
    this.wake = null;
    this.lastNote = null;
  }

  /** Tell the page something once, not at every retry while it stays true. */
  note(text) {
    if (text === this.lastNote) return;
    this.lastNote = text;
    this.onNote(text);
  }

  start() {
    this.run();
    return this;
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
    this.wake?.abort();
  }

  pause() {
    this.paused = true;
    this.controller?.abort();
    this.onState("paused");
  }

  resume() {
    this.paused = false;
    this.wake?.abort();
  }

  /** The server answers again: end the wait before the next attempt, if one is under way. */
  nudge() {
    if (!this.paused && !this.stopped) this.wake?.abort();
  }

  async run() {
    let delay = RETRY_MIN_MS;
    while (!this.stopped) {
      if (this.paused || state.awaitingToken) {
        this.wake = new AbortController();
        if (state.awaitingToken) {
          this.onState("waiting for token");
          await Promise.race([tokenGiven(), sleep(3_600_000, this.wake.signal)]);
        } else {
          await sleep(3_600_000, this.wake.signal);
        }
        continue;
      }
      this.controller = new AbortController();
      const signal = this.controller.signal;
      const extra = { Accept: "text/event-stream" };
      if (this.lastId !== null) extra["Last-Event-ID"] = this.lastId;
      this.onState(this.lastId === null ? "connecting" : "reconnecting");
      const sentWith = token;
      try {
        const response = await fetch(`v1/maps/${encodeURIComponent(this.map)}/changes`, {
          headers: headers(extra),
          cache: "no-store",
          signal,
        });
        if (response.status === 401) {
          askForToken(sentWith);
          continue;
        }
        if ((response.status === 410 || response.status === 400) && this.lastId !== null) {
          const err = await errorOf(response);
          this.note(
            `Could not resume (${err.code}): changes since the last one shown may be missing; following from now.`,
          );
          this.lastId = null;
          continue;
        }
        if (!response.ok || !response.body) throw await errorOf(response);
        const parser = new EventStreamParser((event) => this.event(event));
        if (this.lastId !== null) parser.lastEventId = this.lastId;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.push(value);
          delay = Math.max(RETRY_MIN_MS, parser.retry ?? 0); // it answers: start backing off anew
        }
      } catch (exc) {
        if (signal.aborted) continue;
        this.note(`Change stream interrupted: ${exc.message}${exc.code ? ` (${exc.code})` : ""}`);
      }
      if (this.stopped || this.paused) continue;
      this.onState("reconnecting");
      this.wake = new AbortController();
      await sleep(delay, this.wake.signal);
      delay = Math.min(delay * 2, RETRY_MAX_MS);
    }
  }

  event(event) {
    if (event.id !== null) this.lastId = event.id;
    if (event.type === "cursor") {
      this.lastNote = null;
      this.onState("live");
      return;
    }
    if (event.type === "error") {
      // The server ends the stream after it: say why; a cursor it can no longer serve is
      // dropped, so the stream goes on from now rather than failing again.
      let error = {};
      try {
        error = JSON.parse(event.data).error ?? {};
      } catch {
        // keep the generic note
      }
      if (error.code === "cursor_expired" || error.code === "bad_cursor") this.lastId = null;
      this.note(`The server ended the stream: ${error.message ?? event.data} (${error.code ?? "error"})`);
      return;
    }
    if (event.type !== "change") return;
    let change;
    try {
      change = JSON.parse(event.data);
    } catch {
      this.note("A change that is not JSON was skipped.");
      return;
    }
    this.onState("live");
    this.onChange(change, event.id);
  }
}

// ---------------------------------------------------------------------------------------------
// The page.

const $ = (id) => document.getElementById(id);

const state = {
  awaitingToken: false,
  selected: null, // {kind: "map" | "directory", name}
  status: null,
  keyCursor: null,
  keyQuery: 0,
  valueKey: undefined,
  stream: null,
  changeCount: 0,
  refreshing: false,
  refreshAgain: false,
  keysNotReady: false,
};

function el(tag, { text, cls, attrs } = {}, children = []) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  if (attrs) for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}

function timeNow() {
  return new Date().toLocaleTimeString([], { hour12: false });
}

/** The connection line: a live region, so it changes only when the connection does; the
 *  time of the last refresh sits beside it, outside the region. */
function setConnection(kind, text, refreshed = "") {
  const node = $("connection");
  node.dataset.state = kind;
  if (node.textContent !== text) node.textContent = text;
  $("refreshed").textContent = refreshed;
}

// --- the token ---------------------------------------------------------------------------------

/** Show the token form after a 401 to a request sent with token `sentWith`. An answer to a
 *  request sent with an older token than the current one is stale and changes nothing. */
function askForToken(sentWith) {
  if (sentWith !== token) return;
  const refused = Boolean(token);
  if (refused) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
  }
  if (state.awaitingToken) return;
  state.awaitingToken = true;
  document.body.dataset.state = "token";
  const form = $("token-form");
  $("token-message").textContent = refused
    ? "The server refused that token (401 unauthorized). Enter the right one; it is kept in this tab only (session storage)."
    : "The server answered 401 unauthorized: it needs a bearer token. It is kept in this tab only (session storage).";
  form.hidden = false;
  setConnection("token", "Waiting for a token");
  $("token-input").focus();
}

function tokenSubmitted(event) {
  event.preventDefault();
  const input = $("token-input");
  const value = input.value.trim();
  if (!value) return;
  token = value;
  sessionStorage.setItem(TOKEN_KEY, value);
  input.value = "";
  $("token-form").hidden = true;
  state.awaitingToken = false;
  document.body.dataset.state = "loading";
  const waiters = tokenWaiters;
  tokenWaiters = [];
  waiters.forEach((resolve) => resolve());
  refresh();
  if (state.selected) searchKeys();
}

// --- the lists of maps and directories ------------------------------------------------------

/** Brings list `ul` in line with `items`, reusing the element of each name so that a refresh
 *  neither flickers nor loses the focus. */
function syncList(ul, kind, items, describe) {
  const existing = new Map();
  for (const li of ul.children) existing.set(li.dataset.name, li);
  const wanted = new Set(items.map((item) => item.name));
  for (const [name, li] of existing) if (!wanted.has(name)) li.remove();
  items.forEach((item, index) => {
    let li = existing.get(item.name);
    if (!li) {
      li = el("li");
      li.dataset.name = item.name;
      const button = el("button", { attrs: { type: "button" } }, [
        el("span", { cls: "name", text: item.name }),
        el("span", { cls: "meta" }),
      ]);
      button.dataset[kind] = item.name;
      button.addEventListener("click", () => select(kind, item.name));
      li.append(button);
    }
    const button = li.firstChild;
    const meta = describe(item);
    button.querySelector(".meta").textContent = meta.text;
    if (meta.state) button.dataset.state = meta.state;
    const current = state.selected && state.selected.kind === kind && state.selected.name === item.name;
    if (current) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
    if (ul.children[index] !== li) ul.insertBefore(li, ul.children[index] ?? null);
  });
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

function renderLists(maps, directories) {
  syncList($("maps"), "map", maps, (m) => ({
    text: [
      typeof m.partitions === "number" ? plural(m.partitions, "partition", "partitions") : null,
      m.open ? "open" : "not open",
    ]
      .filter(Boolean)
      .join(" · "),
    state: m.open ? "open" : "closed",
  }));
  syncList($("directories"), "directory", directories, (d) => ({
    text: [d.ready ? "ready" : d.open ? "loading" : "not open"].join(" · "),
    state: d.ready ? "ready" : d.open ? "loading" : "closed",
  }));
  $("maps-count").textContent = `(${maps.length})`;
  $("directories-count").textContent = `(${directories.length})`;
  $("maps-empty").hidden = maps.length > 0;
  $("directories-empty").hidden = directories.length > 0;
}

// --- the selected map or directory ----------------------------------------------------------

function basePath() {
  const { kind, name } = state.selected;
  return `v1/${kind === "map" ? "maps" : "directories"}/${encodeURIComponent(name)}`;
}

function renderStatus(status) {
  state.status = status;
  const table = partitionTable(status);
  const thead = $("partitions").tHead.rows[0];
  const tbody = $("partitions").tBodies[0];
  thead.replaceChildren(...table.columns.map((c) => el("th", { text: columnLabel(c), attrs: { scope: "col" } })));
  tbody.replaceChildren(
    ...table.rows.map((r) => {
      const tr = el("tr");
      tr.dataset.partition = String(r.partition);
      for (const c of table.columns) {
        const v = r[c];
        const cell = el(c === "partition" ? "th" : "td", { text: cellText(c, v) });
        if (c === "partition") cell.setAttribute("scope", "row");
        cell.dataset.column = c;
        if (c === "lag" && typeof v === "number" && v > 0) cell.classList.add("behind");
        tr.append(cell);
      }
      return tr;
    }),
  );
  $("partitions").hidden = table.rows.length === 0;

  const facts = statusFacts(status, table.used);
  $("status-facts").replaceChildren(
    ...facts.map(([label, text]) => {
      const dd = el("dd", { text });
      dd.dataset.fact = label;
      return el("div", {}, [el("dt", { text: label }), dd]);
    }),
  );

  const errors = errorLines(status);
  $("errors").replaceChildren(...errors.map((line) => el("li", { text: line })));
  $("errors-none").hidden = errors.length > 0;
  $("errors-count").textContent = errors.length ? `(${errors.length})` : "";

  const summary = [];
  if (state.selected.kind === "directory") {
    const ready = status.ready === true;
    summary.push(ready ? "ready" : "loading");
    $("selected-summary").dataset.ready = String(ready);
    // Its keys could not be listed while it loaded (503 not_ready): list them now.
    if (ready && state.keysNotReady) searchKeys();
  }
  if (typeof status.size === "number") summary.push(plural(status.size, "key", "keys"));
  const lag = table.rows.reduce((sum, r) => sum + (typeof r.lag === "number" ? r.lag : 0), 0);
  if (table.columns.includes("lag")) summary.push(`lag ${lag}`);
  $("selected-summary").textContent = summary.join(" · ");
  $("status-updated").textContent = `updated ${timeNow()}`;
  $("status-error").hidden = true;
}

async function refreshStatus() {
  if (!state.selected) return;
  const selected = state.selected;
  try {
    const status = await api(basePath());
    if (state.selected === selected) renderStatus(status);
  } catch (exc) {
    if (state.selected !== selected || exc.status === 401) return;
    $("status-error").textContent = `Status unavailable: ${exc.message} (${exc.code})`;
    $("status-error").hidden = false;
  }
}

async function refresh() {
  if (state.awaitingToken) return;
  if (state.refreshing) {
    state.refreshAgain = true; // what it fetches may be older than what the caller knows
    return;
  }
  state.refreshing = true;
  state.refreshAgain = false;
  try {
    const [maps, directories] = await Promise.all([api("v1/maps"), api("v1/directories")]);
    renderLists(maps.maps ?? [], directories.directories ?? []);
    if (document.body.dataset.state === "error") state.stream?.nudge();
    document.body.dataset.state = "ready";
    setConnection("ok", `Connected to ${location.host}`, `· refreshed ${timeNow()}`);
    await refreshStatus();
  } catch (exc) {
    if (exc.status === 401) return;
    document.body.dataset.state = "error";
    setConnection("error", `${exc.message} (${exc.code}); retrying every ${REFRESH_MS / 1000} s`, `· tried ${timeNow()}`);
  } finally {
    state.refreshing = false;
    if (state.refreshAgain) refresh();
  }
}

function select(kind, name, { fromHash = false } = {}) {
  const same = state.selected && state.selected.kind === kind && state.selected.name === name;
  if (!fromHash) {
    const hash = `#${kind}/${encodeURIComponent(name)}`;
    if (location.hash !== hash) history.pushState(null, "", hash);
  }
  if (same) return;
  state.stream?.stop();
  state.stream = null;
  state.selected = { kind, name };
  state.status = null;
  state.valueKey = undefined;
  state.changeCount = 0;
  state.keysNotReady = false;
  for (const button of document.querySelectorAll(".items button")) {
    const current = button.dataset[kind] === name;
    if (current) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
  }
  $("welcome").hidden = true;
  $("selected").hidden = false;
  $("selected").dataset.kind = kind;
  $("selected").dataset.name = name;
  $("selected-kind").textContent = kind === "map" ? "Map" : "Directory";
  $("selected-name").textContent = name;
  $("selected-summary").textContent = "";
  $("status-facts").replaceChildren();
  $("partitions").tHead.rows[0].replaceChildren();
  $("partitions").tBodies[0].replaceChildren();
  $("errors").replaceChildren();
  $("value-key").textContent = "";
  $("value-meta").textContent = "";
  $("value-view").textContent = "Pick a key.";
  $("value-view").dataset.state = "empty";
  $("key-search").value = "";
  $("changes").replaceChildren();
  $("changes-count").textContent = "";
  document.title = `${name} · kafkakv console`;
  const isMap = kind === "map";
  $("changes-panel").hidden = !isMap;
  if (isMap) {
    state.stream = new ChangeStream(name, {
      onChange: showChange,
      onState: (s) => {
        $("changes-state").textContent = s;
        $("changes-state").dataset.state = s;
      },
      onNote: (text) => noteChange(text),
    }).start();
    $("changes-pause").textContent = "Pause";
    $("changes-pause").setAttribute("aria-pressed", "false");
  }
  // The list learns at once that the server opened it.
  refreshStatus().then(refresh);
  searchKeys();
}

// --- keys and values --------------------------------------------------------------------------

async function searchKeys({ more = false } = {}) {
  if (!state.selected) return;
  const query = ++state.keyQuery;
  const prefix = $("key-search").value;
  const params = new URLSearchParams({ limit: String(KEY_PAGE), values: "false" });
  if (prefix) params.set("prefix", prefix);
  if (more && state.keyCursor) params.set("cursor", state.keyCursor);
  $("key-state").textContent = "Searching…";
  state.keysNotReady = false;
  $("key-list").setAttribute("aria-busy", "true");
  try {
    const page = await api(`${basePath()}/keys?${params}`);
    if (query !== state.keyQuery) return;
    const items = page.items ?? [];
    const list = $("key-list");
    if (!more) list.replaceChildren();
    list.dataset.prefix = prefix;
    const current = state.valueKey === undefined ? null : keyText(state.valueKey);
    for (const item of items) {
      const text = keyText(item.key);
      const button = el("button", { text, cls: "mono", attrs: { type: "button" } });
      button.dataset.key = text;
      if (text === current) button.setAttribute("aria-current", "true");
      button.addEventListener("click", () => showValue(item.key, button));
      list.append(el("li", {}, [button]));
    }
    state.keyCursor = page.next ?? null;
    $("key-more").hidden = !state.keyCursor;
    const shown = list.children.length;
    $("key-state").textContent =
      shown === 0
        ? prefix
          ? `No key starts with “${prefix}”.`
          : "No keys."
        : `${plural(shown, "key", "keys")} shown${state.keyCursor ? ", more after" : ""}.`;
  } catch (exc) {
    if (query !== state.keyQuery || exc.status === 401) return;
    state.keysNotReady = exc.code === "not_ready";
    $("key-state").textContent = state.keysNotReady
      ? "Still loading: the keys are listed once it is ready."
      : `Could not list keys: ${exc.message} (${exc.code})`;
  } finally {
    if (query === state.keyQuery) $("key-list").removeAttribute("aria-busy");
  }
}

async function showValue(key, button) {
  if (!state.selected) return;
  for (const b of $("key-list").querySelectorAll("button[aria-current]")) b.removeAttribute("aria-current");
  button?.setAttribute("aria-current", "true");
  state.valueKey = key;
  const view = $("value-view");
  $("value-key").textContent = keyText(key);
  view.dataset.state = "loading";
  try {
    const answer = await api(`${basePath()}/keys/${keyPath(key)}`);
    if (state.valueKey !== key) return;
    view.textContent = valueText(answer.value);
    view.dataset.state = "value";
    const meta = [];
    if (answer.version !== undefined) meta.push(`version ${answer.version}`);
    meta.push(`read ${timeNow()}`);
    $("value-meta").textContent = meta.join(" · ");
  } catch (exc) {
    if (state.valueKey !== key || exc.status === 401) return;
    view.textContent = exc.code === "key_not_found" ? "No such key (removed since it was listed?)." : `${exc.message} (${exc.code})`;
    view.dataset.state = "error";
    $("value-meta").textContent = "";
  }
}

// --- live changes -----------------------------------------------------------------------------

function trimChanges() {
  const list = $("changes");
  while (list.children.length > MAX_CHANGES) list.lastChild.remove();
}

function showChange(change, id) {
  state.changeCount += 1;
  $("changes-count").textContent = `(${state.changeCount} since opened)`;
  const removed = change.new === null || change.new === undefined;
  const added = change.old === null || change.old === undefined;
  const kind = removed ? "removed" : added ? "added" : "changed";
  const li = el("li", { cls: `change ${kind}` });
  li.dataset.key = keyText(change.key);
  li.dataset.kind = kind;
  if (id) li.dataset.cursor = id;
  const where = [];
  if (change.partition !== undefined) where.push(`p${change.partition}`);
  if (change.offset !== undefined) where.push(`@${change.offset}`);
  li.append(
    el("time", { text: timeNow(), cls: "muted" }),
    el("span", { text: where.join(" "), cls: "where muted" }),
    el("span", { text: kind, cls: "what" }),
    el("span", { text: keyText(change.key), cls: "key mono" }),
  );
  const body = el("span", { cls: "values mono" });
  if (!added) body.append(el("del", { text: JSON.stringify(change.old) }));
  if (!added && !removed) body.append(el("span", { text: " → ", cls: "arrow", attrs: { "aria-label": "becomes" } }));
  if (!removed) body.append(el("ins", { text: JSON.stringify(change.new) }));
  li.append(body);
  $("changes").prepend(li);
  trimChanges();
  // The value on view follows its key's changes.
  if (state.valueKey !== undefined && JSON.stringify(state.valueKey) === JSON.stringify(change.key)) {
    const view = $("value-view");
    view.textContent = removed ? "Removed." : valueText(change.new);
    view.dataset.state = removed ? "removed" : "value";
    $("value-meta").textContent = `changed ${timeNow()}`;
  }
}

function noteChange(text) {
  const li = el("li", { cls: "note", text: `${timeNow()} ${text}` });
  $("changes").prepend(li);
  trimChanges();
}

// --- start ------------------------------------------------------------------------------------

function route() {
  const match = /^#(map|directory)\/(.+)$/.exec(location.hash);
  if (!match) return;
  let name;
  try {
    name = decodeURIComponent(match[2]);
  } catch {
    return;
  }
  select(match[1], name, { fromHash: true });
}

function start() {
  $("token-form").addEventListener("submit", tokenSubmitted);
  let typing = null;
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(typing);
    searchKeys();
  });
  $("key-search").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(searchKeys, 250);
  });
  $("key-more").addEventListener("click", () => searchKeys({ more: true }));
  $("changes-pause").addEventListener("click", (event) => {
    const button = event.currentTarget;
    if (!state.stream) return;
    if (state.stream.paused) {
      state.stream.resume();
      button.textContent = "Pause";
      button.setAttribute("aria-pressed", "false");
    } else {
      state.stream.pause();
      button.textContent = "Resume";
      button.setAttribute("aria-pressed", "true");
    }
  });
  $("changes-clear").addEventListener("click", () => $("changes").replaceChildren());
  window.addEventListener("popstate", route);
  window.addEventListener("hashchange", route);
  route();
  refresh();
  setInterval(refresh, REFRESH_MS);
}

start();
