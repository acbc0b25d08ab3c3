/**
 * How every request reaches pollbox: the base URL, the token and where it
 * goes (the `Authorization` header, the cookie, or `?access_token=`, as
 * docs/private-boxes.md describes), the single refresh in flight, and the
 * errors the client reports.
 *
 * What it is not: a retry policy. Whether a request is sent again is decided
 * by its caller (follow.ts for reads, write.ts for posts).
 */

/** A box's payload as pollbox renders it: its key, its version, its fields. */
export interface Payload {
  k: string;
  ver: number;
  [field: string]: unknown;
}

/**
 * A token, or a function that returns a fresh one. With `tokenIn: "cookie"`
 * the function is what sets a fresh cookie (e.g. a call to the game's
 * backend); what it returns is not used.
 */
export type TokenOption = string | (() => unknown);

/** Where the token goes. */
export type TokenPlacement = "header" | "cookie" | "query";

export interface ClientOptions {
  /** pollbox's base URL, e.g. `https://pollbox.example` (no trailing `/v1`). */
  url: string;
  token?: TokenOption;
  /**
   * `"header"` (default): `Authorization: Bearer` on every request, a stream
   * included (a fetch-based stream can send it; an `EventSource` cannot).
   * `"cookie"`: the browser sends the `pollbox_token` cookie (credentials are
   * included). `"query"`: `?access_token=`, for a server with
   * `auth.jwt.query_param = true`.
   */
  tokenIn?: TokenPlacement;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * Read streams with the runtime's `EventSource` where it has one and no
   * header must carry the token (default true): in a browser it parses the
   * stream natively, for less CPU per update than reading it with `fetch`.
   * `false`: always `fetch`.
   */
  eventSource?: boolean;
  /** First reconnect window in ms (default 1000, pollbox's `retry:`). */
  backoffMs?: number;
  /** Cap of the reconnect window in ms (default 30000). */
  maxBackoffMs?: number;
  /** A stream with no first byte within this many ms does not flow (default 5000). */
  firstByteMs?: number;
  /** After falling back to long-polls, try a stream again after this many ms (default 60000). */
  streamRetryMs?: number;
  /** A stream silent this long is dead: reconnect (default 40000; pollbox's heartbeat is 15 s). */
  idleMs?: number;
  /** `wait_ms` of a long-poll (default 25000). */
  waitMs?: number;
}

/** A request pollbox refused, or one that did not get an answer. */
export class PollboxError extends Error {
  constructor(
    message: string,
    /** The HTTP status; 0 when no answer came. */
    readonly status: number,
    /** How long the server asked to wait (`Retry-After`), in ms. */
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = "PollboxError";
  }
}

/** The token and where it goes; at most one refresh runs at a time. */
export class Access {
  readonly base: string;
  readonly fetch: typeof fetch;
  private token: string | undefined;
  private refreshing: Promise<void> | undefined;

  constructor(readonly options: ClientOptions) {
    this.base = options.url.replace(/\/+$/, "");
    const f = options.fetch ?? globalThis.fetch;
    // A bare reference to the global fetch loses its `this` in browsers.
    this.fetch = (input, init) => f(input, init);
    if (typeof options.token === "string") this.token = options.token;
  }

  /** A token function is given: a 401 or `event: expired` can be mended. */
  get refreshable(): boolean {
    return typeof this.options.token === "function";
  }

  /**
   * Get a fresh token. Callers that saw the same stale token share one call
   * of the token function; a caller whose token was already replaced
   * (`stale` is not the current one) gets the new one without another call.
   */
  refresh(stale = this.token): Promise<void> {
    const source = this.options.token;
    if (typeof source !== "function" || stale !== this.token) return Promise.resolve();
    if (!this.refreshing) {
      this.refreshing = (async () => {
        try {
          const t = await source();
          if (typeof t === "string") this.token = t;
        } finally {
          this.refreshing = undefined;
        }
      })();
    }
    return this.refreshing;
  }

  /** The token requests use now (after a first call of the function). */
  async current(): Promise<string | undefined> {
    if (this.refreshing) await this.refreshing;
    else if (this.token === undefined && this.refreshable) await this.refresh();
    return this.token;
  }

  /**
   * A request to `path` (with `query`, values already percent-encoded)
   * carrying the token:
   * its URL and init, and the token it used (for `refresh(stale)`).
   */
  async request(
    path: string,
    query: [string, string][],
    init: RequestInit & { headers?: Record<string, string> },
  ): Promise<[string, RequestInit, string | undefined]> {
    const token = await this.current();
    const placement = this.options.tokenIn ?? "header";
    const headers: Record<string, string> = { ...init.headers };
    const q = query.slice();
    if (token !== undefined && placement === "header") headers.Authorization = "Bearer " + token;
    if (token !== undefined && placement === "query") q.push(["access_token", encodeURIComponent(token)]);
    const qs = q.map(([k, v]) => k + "=" + v).join("&");
    const url = this.base + path + (qs ? "?" + qs : "");
    const out: RequestInit = { cache: "no-store", ...init, headers };
    if (placement === "cookie") out.credentials = "include";
    return [url, out, token];
  }
}

/** `/v1/boxes/{key}` */
export function boxPath(key: string): string {
  return "/v1/boxes/" + encodeURIComponent(key);
}

/** The JSON body of an answer, or `undefined` when it has none or is not JSON. */
export async function jsonBody(res: Response): Promise<unknown> {
  try {
    return JSON.parse(await res.text());
  } catch {
    return undefined;
  }
}

/** The `error` member of an error answer's body, else the status line. */
export function errorText(body: unknown, res: Response): string {
  const e = body && typeof body === "object" ? (body as { error?: unknown }).error : undefined;
  return typeof e === "string" ? e : "HTTP " + res.status;
}
