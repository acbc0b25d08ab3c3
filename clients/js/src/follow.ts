/**
 * Following boxes: one key, many keys, or a prefix, over an event stream,
 * with long-polls where the stream does not flow. One loop per stream of at
 * most 64 keys: connect, hand over what is newer, and when the connection
 * ends wait a jittered backoff (or the server's `Retry-After`) and resume
 * from what the page has (`last_event_id`, `If-None-Match`, `after`), so a
 * reconnect, another node behind a proxy or a restarted server sends only
 * what moved, and the version gate drops anything older that it sends again.
 *
 * A prefix (a room) is listed whole where the server cannot resume it: on a
 * stream without an id it honors, after `event: reset`, on the first walk of
 * its pages and in a long-poll answer with `reset`. A listing is what the
 * room holds: at its end (`event: synced`, the last page) every box the page
 * has that it did not name is gone.
 *
 * A stream with no first byte within `firstByteMs` (pollbox sends `retry:`
 * at once; a buffering proxy holds it) falls back to long-polls, and the
 * stream is tried again after `streamRetryMs`. In a browser the stream is an
 * `EventSource` (native parsing: the least CPU per update) unless the token
 * must go in a header; elsewhere, and then, it is read with `fetch`, which
 * sends headers and sees statuses, `Retry-After` and the first byte. What an
 * `EventSource` hides is asked after it fails: one plain poll of the same
 * boxes gives the status (401, 429 with `Retry-After`, ...). Without a first
 * byte to see, an `EventSource` that does not open within `firstByteMs` is
 * taken as not flowing.
 *
 * A token function's token is replaced right before the request that uses
 * it, after any wait (backoff.ts `Renewal`): at once after `event: expired`
 * on a stream that flowed, or after a first 401; a fresh token refused too is
 * reported (`error`, 401, not fatal) and the next one waits a backoff.
 *
 * With `member` (docs/presence.md), the follow is also a presence connection:
 * every stream and every long-poll that waits carries `member=` (and
 * `info=`), so the member is in the room while the follow runs and leaves the
 * server's grace after it stops. Only a room (a prefix) and a room's presence
 * box can carry it; the presence box is then followed as one box
 * (`/v1/boxes/<room>~presence`, resumed with `last_event_id=V` or
 * `after=V`), since a stream of many boxes does not read `member=`.
 *
 * What it is not: a reader of single polls (pollbox.ts `read`) or a writer.
 */

import { Access, PollboxError, boxPath, errorText, jsonBody, type ClientOptions, type Payload } from "./access";
import { Backoff, Renewal, sleep } from "./backoff";
import { SseParser, type SseEvent } from "./sse";
import { Versions } from "./versions";

/** A key, `{ key }`, `{ keys }` (any number; 64 per stream), or `{ prefix }`. */
export type Target = string | { key: string } | { keys: readonly string[] } | { prefix: string };

/** How the boxes reach the page now. */
export type Mode = "stream" | "long-poll";

export interface FollowHandlers {
  /** A box's payload, newer than any the page was handed for its key. */
  update(payload: Payload): void;
  /** A box the page had is gone (deleted or expired). */
  deleted?(key: string): void;
  /** The transport changed (`"long-poll"` after a stream that did not flow). */
  mode?(mode: Mode): void;
  /** A failed connection or a refusal; `fatal` ones end the following. */
  error?(error: PollboxError, fatal: boolean): void;
}

export interface FollowOptions {
  /** Stop following when it aborts. */
  signal?: AbortSignal;
  /** `"auto"` (default): streams, long-polls where they do not flow. */
  transport?: "auto" | "stream" | "long-poll";
  /**
   * Be present in the room as this member while following (docs/presence.md):
   * for a `{ prefix }` or the key `<room>~presence` only (else a `TypeError`).
   * On a node whose reads need a token, it must be the token's `sub`.
   */
  member?: string;
  /** The member's info (a JSON object of at most 400 bytes), on a public node
   * only: with tokens it comes from the token's `pollbox.info` claim. */
  info?: object;
}

export interface Follow {
  /** Stop following (as the signal does). */
  close(): void;
  /** Settles once every connection has stopped. */
  done: Promise<void>;
}

/** The most keys one request may name (pollbox's `max_keys_per_request`). */
const KEYS_PER_STREAM = 64;

/** How one connection ended. */
type Outcome =
  | { kind: "ended"; flowed: boolean }
  | { kind: "stalled" }
  | { kind: "no-stream" }
  | { kind: "polled" }
  /** The token ended: `event: expired` on a stream that flowed, or a 401 (`error`). */
  | { kind: "expired"; token: string | undefined; error?: PollboxError }
  | { kind: "refused"; error: PollboxError };

export function follow(access: Access, target: Target, h: FollowHandlers, o: FollowOptions = {}): Follow {
  const ctl = new AbortController();
  const stop = () => ctl.abort();
  if (o.signal?.aborted) stop();
  o.signal?.addEventListener("abort", stop, { once: true });
  let groups: (readonly string[] | string)[];
  if (typeof target === "string") groups = [[target]];
  else if ("key" in target) groups = [[target.key]];
  else if ("keys" in target) {
    const keys = [...new Set(target.keys)];
    groups = [];
    for (let i = 0; i < keys.length; i += KEYS_PER_STREAM) groups.push(keys.slice(i, i + KEYS_PER_STREAM));
  } else groups = [target.prefix];
  const present = presenceQuery(groups, o);
  const transport = o.transport ?? "auto";
  const runs = groups.map((g) => new Follower(access, g, h, transport, ctl.signal, present).run());
  const done = Promise.all(runs).then(() => {
    o.signal?.removeEventListener("abort", stop);
  });
  return { close: stop, done };
}

/**
 * `member=` and `info=` (percent-encoded) of a follow as a member, or none.
 * A member needs a room or a room's presence key: a stream of many boxes, or
 * of another box, would ignore it, and the page would never be present.
 */
function presenceQuery(groups: readonly (readonly string[] | string)[], o: FollowOptions): [string, string][] {
  if (o.member === undefined) {
    if (o.info !== undefined) throw new TypeError("info goes with member");
    return [];
  }
  const g = groups[0];
  if (groups.length !== 1 || (typeof g !== "string" && (g.length !== 1 || !g[0].endsWith("~presence")))) {
    throw new TypeError("member needs a { prefix } or a room's presence key (<room>~presence)");
  }
  const q: [string, string][] = [["member", encodeURIComponent(o.member)]];
  if (o.info !== undefined) q.push(["info", encodeURIComponent(JSON.stringify(o.info))]);
  return q;
}

class Follower {
  private readonly versions = new Versions();
  private readonly backoff: Backoff;
  private readonly renewal: Renewal;
  private readonly opts: Required<Omit<ClientOptions, "token" | "tokenIn" | "fetch" | "url" | "eventSource">>;
  private mode: Mode | undefined;
  private nextStreamAt = 0;
  /** The many-box ETag of the last long-poll answer. */
  private etag: string | undefined;
  /** A prefix stream's last id (opaque). */
  private lastId = "";
  /** A room's watermark for its long-polls (a page's `after`). */
  private after: string | undefined;
  /** The keys a room's listing named so far, while one runs. */
  private listed: Set<string> | undefined;
  private expired = false;
  /** A presence key followed as a member: one box, by its own path. */
  private readonly one: string | undefined;

  constructor(
    private readonly access: Access,
    /** The keys of this stream, or a prefix. */
    private readonly what: readonly string[] | string,
    private readonly h: FollowHandlers,
    private readonly transport: "auto" | "stream" | "long-poll",
    private readonly signal: AbortSignal,
    /** `member=` and `info=`, on every stream and waiting long-poll. */
    private readonly present: [string, string][] = [],
  ) {
    const o = access.options;
    this.opts = {
      backoffMs: o.backoffMs ?? 1000,
      maxBackoffMs: o.maxBackoffMs ?? 30000,
      firstByteMs: o.firstByteMs ?? 5000,
      streamRetryMs: o.streamRetryMs ?? 60000,
      idleMs: o.idleMs ?? 40000,
      waitMs: o.waitMs ?? 25000,
    };
    this.backoff = new Backoff(this.opts.backoffMs, this.opts.maxBackoffMs);
    this.renewal = new Renewal(this.backoff);
    if (transport === "long-poll") this.nextStreamAt = Infinity;
    this.one = present.length && typeof what !== "string" ? what[0] : undefined;
  }

  async run(): Promise<void> {
    // The token to replace right before the next request (after any wait).
    let stale: [string | undefined] | undefined;
    while (!this.signal.aborted) {
      if (stale) {
        try {
          await this.access.refresh(stale[0]);
          this.renewal.fetched();
          stale = undefined;
        } catch (e) {
          this.report(new PollboxError("token refresh failed: " + String(e), 401), false);
          await sleep(this.backoff.next(), this.signal);
          continue;
        }
        if (this.signal.aborted) return;
      }
      const streaming = this.transport === "stream" || Date.now() >= this.nextStreamAt;
      const o = streaming ? await this.stream() : await this.longPoll();
      if (this.signal.aborted) return;
      let wait = 0;
      switch (o.kind) {
        case "polled":
          this.renewal.flowed();
          break;
        case "stalled":
          if (this.transport === "stream") {
            wait = this.backoff.next();
          } else {
            this.nextStreamAt = Date.now() + this.opts.streamRetryMs;
            this.setMode("long-poll");
          }
          break;
        case "no-stream":
          this.nextStreamAt = Infinity;
          break;
        case "expired":
          // A fresh token, fetched after the wait: at once after a stream
          // that flowed or a first 401; a refused fresh token waits a backoff.
          stale = [o.token];
          if (!o.error) this.renewal.flowed();
          else {
            const w = this.renewal.refused(o.error.retryAfterMs);
            if (w !== undefined) {
              this.report(o.error, false);
              wait = w;
            }
          }
          break;
        case "refused": {
          const s = o.error.status;
          const fatal = s === 400 || s === 401 || s === 403 || s === 404 || s === 405;
          this.report(o.error, fatal);
          if (fatal) return;
          wait = o.error.retryAfterMs ?? this.backoff.next();
          break;
        }
        case "ended":
          if (o.flowed) this.renewal.flowed();
          wait = this.backoff.next();
          break;
      }
      if (wait > 0) await sleep(wait, this.signal);
    }
  }

  private report(e: PollboxError, fatal: boolean): void {
    this.h.error?.(e, fatal);
  }

  private setMode(m: Mode): void {
    if (m !== this.mode) {
      this.mode = m;
      this.h.mode?.(m);
    }
  }

  private deliver(p: unknown): void {
    const b = p as Payload;
    if (!b || typeof b.k !== "string" || typeof b.ver !== "number") return;
    this.listed?.add(b.k);
    if (this.versions.accept(b)) this.call(() => this.h.update(b));
  }

  private gone(key: unknown): void {
    if (typeof key === "string" && this.versions.remove(key)) this.call(() => this.h.deleted?.(key));
  }

  /** A room's listing ended: the boxes the page has that it did not name are gone. */
  private synced(): void {
    const named = this.listed;
    this.listed = undefined;
    if (named) for (const k of this.versions.held()) if (!named.has(k)) this.gone(k);
  }

  /** A handler that throws must not break the connection: rethrown apart. */
  private call(f: () => void): void {
    try {
      f();
    } catch (e) {
      setTimeout(() => {
        throw e;
      });
    }
  }

  /** One event of a stream, and the stream's last id with it. */
  private onEvent(e: SseEvent, id: string): void {
    let data: unknown;
    try {
      data = e.data === "" ? undefined : JSON.parse(e.data);
    } catch {
      return this.report(new PollboxError("an event that is not JSON: " + e.data.slice(0, 80), 200), false);
    }
    const room = typeof this.what === "string";
    if (e.event === "" || e.event === "message") this.deliver(data);
    else if (e.event === "deleted") {
      const k = (data as { k?: unknown } | undefined)?.k;
      this.gone(k ?? (room ? undefined : this.what[0]));
    } else if (e.event === "reset") this.listed = new Set();
    else if (e.event === "synced") this.synced();
    else if (e.event === "expired") this.expired = true;
    if (room && id) this.lastId = id;
  }

  private keysParam(keys: readonly string[]): [string, string] {
    return ["keys", keys.map(encodeURIComponent).join(",")];
  }

  /** The path and query of a stream (with `present`: `member=`, `info=`). */
  private streamQuery(present = this.present): [string, [string, string][]] {
    if (this.one !== undefined) {
      // One box resumes from the version the page has, in decimal.
      const v = this.versions.version(this.one);
      return [boxPath(this.one), [...(v ? [["last_event_id", String(v)] as [string, string]] : []), ...present]];
    }
    if (typeof this.what === "string") {
      const q: [string, string][] = [["prefix", encodeURIComponent(this.what)]];
      if (this.lastId) q.push(["last_event_id", encodeURIComponent(this.lastId)]);
      return ["/v1/boxes", [...q, ...present]];
    }
    const q = [this.keysParam(this.what)];
    const id = this.versions.resumeId(this.what);
    if (id) q.push(["last_event_id", id]);
    return ["/v1/boxes", q];
  }

  /** One event stream, read until it ends, stalls or the signal aborts. */
  private async stream(): Promise<Outcome> {
    const o = this.access.options;
    const native = typeof EventSource === "function" && o.eventSource !== false;
    const header = o.token !== undefined && (o.tokenIn ?? "header") === "header";
    // A room without an id to resume from is listed whole.
    this.listed = typeof this.what === "string" && !this.lastId ? new Set() : undefined;
    return native && !header ? this.eventSource() : this.fetchStream();
  }

  /** The stream as an `EventSource`, closed at its first error (the loop
   * reconnects, resuming boxes from the page's versions, a room from the
   * last id its events carried). */
  private async eventSource(): Promise<Outcome> {
    const [url, init, token] = await this.access.request(...this.streamQuery(), {});
    this.expired = false;
    const outcome = await new Promise<Outcome | undefined>((done) => {
      const es = new EventSource(url, { withCredentials: init.credentials === "include" });
      let opened = false;
      const finish = (o: Outcome | undefined) => {
        clearTimeout(timer);
        es.close();
        this.signal.removeEventListener("abort", stop);
        done(o);
      };
      const stop = () => finish({ kind: "ended", flowed: opened });
      this.signal.addEventListener("abort", stop, { once: true });
      const timer = setTimeout(() => finish({ kind: "stalled" }), this.opts.firstByteMs);
      es.onopen = () => {
        opened = true;
        clearTimeout(timer);
        this.setMode("stream");
      };
      for (const t of ["message", "deleted", "reset", "synced"]) {
        es.addEventListener(t, (e) => this.onEvent({ event: t, data: (e as MessageEvent).data }, (e as MessageEvent).lastEventId));
      }
      es.addEventListener("expired", () => finish({ kind: "expired", token }));
      es.onerror = () => finish(opened ? { kind: "ended", flowed: true } : undefined);
    });
    if (outcome || this.signal.aborted) return outcome ?? { kind: "ended", flowed: false };
    // Refused, or no connection: a plain poll of the same boxes says which
    // (without `member=`, which a plain poll may not carry: 400).
    try {
      const probe = this.present.length ? (await this.access.request(...this.streamQuery([]), {}))[0] : url;
      const res = await this.access.fetch(probe, { ...init, signal: this.signal });
      if (res.status !== 200) return await this.refused(res, token);
      await res.body?.cancel();
    } catch (e) {
      if (!this.signal.aborted) this.report(new PollboxError(describe(e), 0), false);
    }
    return { kind: "ended", flowed: false };
  }

  /** The stream read with `fetch`. */
  private async fetchStream(): Promise<Outcome> {
    const ctl = new AbortController();
    const stop = () => ctl.abort();
    this.signal.addEventListener("abort", stop, { once: true });
    let flowed = false;
    let stalled = false;
    let lastByte = 0;
    let idleTimer: ReturnType<typeof setTimeout> | undefined;
    const firstTimer = setTimeout(() => {
      stalled = true;
      ctl.abort();
    }, this.opts.firstByteMs);
    const idleMs = this.opts.idleMs;
    const watch = () => {
      const quiet = Date.now() - lastByte;
      if (quiet >= idleMs) ctl.abort();
      else idleTimer = setTimeout(watch, idleMs - quiet);
    };
    let token: string | undefined;
    let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    this.expired = false;
    try {
      const [url, init, t] = await this.access.request(...this.streamQuery(), {
        headers: { Accept: "text/event-stream" },
        signal: ctl.signal,
      });
      token = t;
      const res = await this.access.fetch(url, init);
      const type = res.headers.get("Content-Type") ?? "";
      if (res.status !== 200) {
        clearTimeout(firstTimer);
        return await this.refused(res, token);
      }
      if (!res.body || !type.startsWith("text/event-stream")) {
        // An answer, but not a stream (an old runtime, or a proxy in the way).
        clearTimeout(firstTimer);
        await res.body?.cancel();
        return { kind: "no-stream" };
      }
      reader = res.body.getReader();
      const decoder = new TextDecoder();
      const parser: SseParser = new SseParser((e) => this.onEvent(e, parser.lastId));
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        lastByte = Date.now();
        if (!flowed) {
          flowed = true;
          clearTimeout(firstTimer);
          this.setMode("stream");
          idleTimer = setTimeout(watch, idleMs);
        }
        parser.push(decoder.decode(value, { stream: true }));
      }
    } catch (e) {
      if (stalled) return { kind: "stalled" };
      if (!this.signal.aborted) this.report(new PollboxError(describe(e), 0), false);
    } finally {
      clearTimeout(firstTimer);
      clearTimeout(idleTimer);
      this.signal.removeEventListener("abort", stop);
      ctl.abort();
      // Cancelling the body is what closes the connection in every runtime
      // (an abort alone leaves Node's socket open).
      reader?.cancel().catch(() => {});
    }
    if (this.expired) return { kind: "expired", token };
    return { kind: "ended", flowed };
  }

  /** One long-poll: answered when a box moves, or 304 after `waitMs`. */
  private async longPoll(): Promise<Outcome> {
    const ctl = new AbortController();
    const stop = () => ctl.abort();
    this.signal.addEventListener("abort", stop, { once: true });
    // A long-poll lost on the way (a dead node) is given up after its wait.
    const timer = setTimeout(stop, this.opts.waitMs + 15000);
    const wait: [string, string] = ["wait_ms", String(this.opts.waitMs)];
    try {
      const what = this.what;
      if (typeof what === "string") {
        const o = await this.roomPoll(what, wait, ctl.signal);
        if (o) return o;
      } else if (this.one !== undefined) {
        // The first one (after=0) is answered at once with the box.
        const after: [string, string] = ["after", String(this.versions.version(this.one) ?? 0)];
        const [url, init, token] = await this.access.request(boxPath(this.one), [after, wait, ...this.present], { signal: ctl.signal });
        const res = await this.access.fetch(url, init);
        if (res.status === 200) this.deliver(await res.json());
        else if (res.status !== 304 && res.status !== 404) return await this.refused(res, token);
        else {
          await res.body?.cancel();
          if (res.status === 404) this.gone(this.one);
        }
      } else {
        const headers: Record<string, string> = this.etag ? { "If-None-Match": this.etag } : {};
        const [url, init, token] = await this.access.request("/v1/boxes", [this.keysParam(what), wait], { headers, signal: ctl.signal });
        const res = await this.access.fetch(url, init);
        if (res.status === 304) {
          await res.body?.cancel();
        } else if (res.status !== 200) {
          return await this.refused(res, token);
        } else {
          this.etag = res.headers.get("ETag") ?? undefined;
          const body = (await res.json()) as unknown[];
          what.forEach((k, i) => (body[i] === null ? this.gone(k) : this.deliver(body[i])));
        }
      }
      this.setMode("long-poll");
      return { kind: "polled" };
    } catch (e) {
      if (!this.signal.aborted) this.report(new PollboxError(describe(e), 0), false);
      return { kind: "ended", flowed: false };
    } finally {
      clearTimeout(timer);
      this.signal.removeEventListener("abort", stop);
    }
  }

  /**
   * A room by long-poll, `after=W` (the last answer's `after`), every page of
   * the answer (`next`, with the same `after`); the first time, or after an
   * answer without `after` (a server without the long-poll form), a walk of
   * the room's pages instead, which lists it (as an answer with `reset`
   * does), and without an `after` to wait on, the next walk after `waitMs`.
   * `this.after` moves only once every page of an answer was read. An
   * outcome only for a refusal.
   */
  private async roomPoll(prefix: string, wait: [string, string], signal: AbortSignal): Promise<Outcome | undefined> {
    const w = this.after;
    const q: [string, string][] = [["prefix", encodeURIComponent(prefix)], ["limit", "1000"]];
    // Only a long-poll that may wait is a presence connection (a page with
    // `member=` is refused): the member is away during a first walk.
    if (w !== undefined) q.push(["after", encodeURIComponent(w)], wait, ...this.present);
    this.listed = new Set();
    let reset = w === undefined;
    let next: unknown;
    let after: unknown = w;
    for (let first = true; first || typeof next === "string"; first = false) {
      const page: [string, string][] = typeof next === "string" ? [...q, ["cursor", encodeURIComponent(next)]] : q;
      const [url, init, token] = await this.access.request("/v1/boxes", page, { signal });
      const res = await this.access.fetch(url, init);
      // Nothing moved past W (a listing cut short: from W again).
      if (res.status === 304) return void (await res.body?.cancel());
      if (res.status !== 200) return this.refused(res, token);
      const b = (await res.json()) as { boxes?: unknown[]; deleted?: unknown[]; next?: unknown; after?: unknown; reset?: unknown };
      // The watermark read before the first page: what moves during the
      // walk is sent again by the next long-poll, never lost.
      if (first) after = b.after;
      reset ||= b.reset === true;
      for (const p of b.boxes ?? []) this.deliver(p);
      for (const k of b.deleted ?? []) this.gone(k);
      next = b.next;
    }
    if (reset) this.synced();
    this.listed = undefined;
    this.after = after == null ? undefined : String(after);
    if (this.after === undefined) await sleep(this.opts.waitMs, signal);
    return undefined;
  }

  private async refused(res: Response, token: string | undefined): Promise<Outcome> {
    const body = await jsonBody(res);
    const after = this.backoff.retryAfter(res.headers.get("Retry-After"));
    const error = new PollboxError(errorText(body, res), res.status, after);
    return res.status === 401 && this.access.refreshable ? { kind: "expired", token, error } : { kind: "refused", error };
  }
}

/** A fetch failure as one line (runtimes put the cause in different places). */
export function describe(e: unknown): string {
  const err = e as { message?: string; cause?: { code?: string; message?: string } };
  const cause = err?.cause?.code ?? err?.cause?.message;
  return (err?.message ?? String(e)) + (cause ? " (" + cause + ")" : "");
}
