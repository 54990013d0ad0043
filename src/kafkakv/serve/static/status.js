// How the console shows the server's answers: pure functions from JSON to rows and text.
// The shapes are those of docs/serve.md: a status holds `partitions` (a count) and
// per-partition fields as objects keyed by partition number (`positions`, `end_offsets`,
// `lag`, and for a map `flushed`), `errors` as a list of records, `stalled` as
// partition -> why, and facts besides (codecs, settings, size, cursor, readiness).

/** A key as it goes in a path: the server gives and takes every key as its text form
 *  (docs/serve.md, "Keys and values"), percent-encoded here. */
export function keyPath(key) {
  return encodeURIComponent(keyText(key));
}

/** How a key reads on the page: its text form (the server sends keys as strings). */
export function keyText(key) {
  return typeof key === "string" ? key : JSON.stringify(key);
}

/** A JSON value as indented text. */
export function valueText(value) {
  return JSON.stringify(value, null, 2);
}

/** The known per-partition fields, in the order of the table, with their headings. A field
 *  the server adds later shows after them, under its own name. */
const COLUMNS = new Map([
  ["partition", "partition"],
  ["positions", "position"],
  ["end_offsets", "end offset"],
  ["lag", "lag"],
  ["flushed", "last flush"],
]);

/** Fields keyed by partition that are not columns: `stalled` is shown with the errors. */
const NOT_COLUMNS = new Set(["stalled"]);

function isScalar(v) {
  return v === null || ["string", "number", "boolean"].includes(typeof v);
}

function isPerPartition(v) {
  if (!v || typeof v !== "object" || Array.isArray(v)) return false;
  const keys = Object.keys(v);
  return keys.length > 0 && keys.every((k) => /^[0-9]+$/.test(k)) && Object.values(v).every(isScalar);
}

/** A status answer as a table: {columns, rows, used}, a row per partition (0 to
 *  `partitions` - 1, and any other a field names) with a cell per per-partition field;
 *  `used` names the fields the table shows. */
export function partitionTable(status) {
  const used = new Set(["partitions"]);
  const rows = new Map();
  const row = (p) => {
    if (!rows.has(p)) rows.set(p, { partition: p });
    return rows.get(p);
  };
  for (let p = 0; p < (status.partitions ?? 0); p += 1) row(p);
  for (const [field, values] of Object.entries(status)) {
    if (NOT_COLUMNS.has(field) || !isPerPartition(values)) continue;
    for (const [p, v] of Object.entries(values)) row(Number(p))[field] = v;
    used.add(field);
  }
  const known = [...COLUMNS.keys()];
  const rank = (c) => (known.includes(c) ? known.indexOf(c) : known.length);
  const columns = ["partition", ...used].filter((c) => c !== "partitions").sort((a, b) => rank(a) - rank(b));
  return { columns, rows: [...rows.values()].sort((a, b) => a.partition - b.partition), used };
}

export function columnLabel(name) {
  return COLUMNS.get(name) ?? name.replaceAll("_", " ");
}

/** A table cell: a dash when absent, a flush offset below 0 as "none yet". */
export function cellText(column, v) {
  if (v === undefined || v === null) return "—";
  if (column === "flushed" && typeof v === "number" && v < 0) return "none yet";
  return String(v);
}

/** A scalar as text: null as a dash, fractions to three decimals (a duration in seconds). */
export function scalarText(v) {
  if (v === null) return "—";
  if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(3);
  return String(v);
}

/** The facts of a status answer the table and the errors do not show, as [label, text]
 *  pairs: scalars, the scalars of objects as `outer › inner`, lists as JSON. */
export function statusFacts(status, used) {
  const facts = [];
  const walk = (prefix, obj) => {
    for (const [k, v] of Object.entries(obj)) {
      if (!prefix && (used.has(k) || ["errors", "stalled", "name"].includes(k))) continue;
      const label = (prefix ? `${prefix} › ${k}` : k).replaceAll("_", " ");
      if (isScalar(v)) facts.push([label, scalarText(v)]);
      else if (typeof v === "object" && !Array.isArray(v) && !prefix) walk(k, v);
      else facts.push([label, JSON.stringify(v)]);
    }
  };
  walk("", status);
  return facts;
}

/** A status answer's errors as lines of text: stalled partitions first, then the records
 *  the replica refused or could not decode (`{topic?, partition, offset, error}`). */
export function errorLines(status) {
  const stalls = Object.entries(status.stalled ?? {}).map(([p, why]) => `partition ${p} stalled: ${why}`);
  const records = (status.errors ?? []).map((e) => {
    const where = [];
    if (e.topic !== undefined) where.push(`topic ${e.topic}`);
    where.push(`partition ${e.partition}`, `offset ${e.offset}`);
    return `${where.join(", ")}: ${e.error}`;
  });
  return stalls.concat(records);
}
