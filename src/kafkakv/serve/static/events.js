// Server-Sent Events read from a fetch() body: the parser, pure (no DOM, no network).
//
// The console streams /v1/maps/{map}/changes with fetch() rather than EventSource so that the
// request can carry an Authorization header; this is the part of EventSource it then needs.

/** Incremental parser of a text/event-stream body (the WHATWG "event stream interpretation").
 *  push() takes decoded text in chunks of any size; onEvent gets {type, data, id} for each
 *  event; lastEventId follows the `id` fields, as EventSource's does. Unlike EventSource, an
 *  event with a type and no data is delivered too: the server's first event, `cursor`. */
export class EventStreamParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.pendingCR = false;
    this.type = "";
    this.data = [];
    this.idBuffer = null;
    this.lastEventId = null;
    this.retry = null;
  }

  push(text) {
    let chunk = text;
    if (this.pendingCR && chunk.startsWith("\n")) chunk = chunk.slice(1); // a \r\n split in two
    this.pendingCR = false;
    this.buffer += chunk;
    let start = 0;
    for (;;) {
      const cr = this.buffer.indexOf("\r", start);
      const lf = this.buffer.indexOf("\n", start);
      if (cr < 0 && lf < 0) break;
      let end;
      let next;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        end = cr;
        if (cr + 1 === this.buffer.length) {
          this.pendingCR = true;
          next = cr + 1;
        } else {
          next = this.buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
        }
      } else {
        end = lf;
        next = lf + 1;
      }
      this.line(this.buffer.slice(start, end));
      start = next;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line.startsWith(":")) return; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    let field = line;
    let value = "";
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
    }
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id") {
      if (!value.includes("\0")) this.idBuffer = value;
    } else if (field === "retry" && /^[0-9]+$/.test(value)) this.retry = Number(value);
  }

  dispatch() {
    if (this.idBuffer !== null) this.lastEventId = this.idBuffer;
    const type = this.type || "message";
    const data = this.data.join("\n");
    const had = this.data.length > 0;
    this.type = "";
    this.data = [];
    if (had || type !== "message") this.onEvent({ type, data, id: this.lastEventId });
  }
}
