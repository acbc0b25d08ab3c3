/**
 * The server-sent events parser: text in, one call per event out, as the
 * `EventSource` of a browser parses a stream (fields `data`, `event`, `id`,
 * `retry`; lines starting with `:` are comments, such as pollbox's heartbeat).
 *
 * What it is not: a connection. It does not fetch, reconnect or decide what an
 * event means; the follower (follow.ts) feeds it the decoded body of a stream.
 */

/** One dispatched event: its type (`""` for a plain message) and data. */
export interface SseEvent {
  event: string;
  data: string;
}

export class SseParser {
  /** The `retry:` the stream asked for, in milliseconds, if any. */
  retry: number | undefined;
  /** The last event id: an `id:` field takes effect when its event is
   * dispatched (persisting across events, as in the spec), so an event's
   * handler reads the id that came with it. */
  lastId = "";
  private id = "";
  private rest = "";
  private data: string[] = [];
  private event = "";

  constructor(private readonly onEvent: (e: SseEvent) => void) {}

  /** Feed decoded text; every event it completes is dispatched, in order. */
  push(text: string): void {
    const buf = this.rest + text;
    let start = 0;
    let nl: number;
    while ((nl = buf.indexOf("\n", start)) >= 0) {
      // pollbox ends lines with LF; a CR before it (a proxy's rewrite) is dropped.
      const end = nl > start && buf.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
      this.line(buf.slice(start, end));
      start = nl + 1;
    }
    this.rest = start === 0 ? buf : buf.slice(start);
  }

  private line(line: string): void {
    if (line === "") {
      // A blank line ends the event; one without data lines is dropped.
      this.lastId = this.id;
      if (this.data.length > 0) {
        const e = { event: this.event, data: this.data.join("\n") };
        this.data = [];
        this.event = "";
        this.onEvent(e);
      } else {
        this.event = "";
      }
      return;
    }
    const colon = line.indexOf(":");
    if (colon === 0) return; // a comment: the heartbeat
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        if (!value.includes("\0")) this.id = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
    }
  }
}
