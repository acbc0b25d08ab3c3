/**
 * Reconnect delays: capped exponential backoff with full jitter, and the
 * server's `Retry-After`. Jitter on every delay, the first one included, is
 * what spreads a crowd of clients that lost their streams at the same moment
 * (a server restart) over the whole window instead of one burst.
 *
 * What it is not: a timer. It only computes delays; the follower and the
 * writer sleep them (see `sleep`).
 */

export class Backoff {
  private attempt = 0;

  constructor(
    private readonly baseMs: number,
    private readonly capMs: number,
    private readonly random: () => number = Math.random,
  ) {}

  /** The next delay: uniform in [0, min(cap, base * 2^attempt)). */
  next(): number {
    const ceiling = Math.min(this.capMs, this.baseMs * 2 ** this.attempt);
    if (ceiling < this.capMs) this.attempt++;
    return Math.floor(this.random() * ceiling);
  }

  /** After a success: the next delay is drawn from the first window again. */
  reset(): void {
    this.attempt = 0;
  }

  /**
   * What to wait after an answer with `Retry-After` (seconds, or an HTTP
   * date): at least what the server asked, plus up to one base window of
   * jitter so that clients told the same second do not come back together.
   * `undefined` when the header is missing or unreadable.
   */
  retryAfter(header: string | null, now = Date.now()): number | undefined {
    if (header === null) return undefined;
    const h = header.trim();
    const ms = /^\d+$/.test(h) ? Number(h) * 1000 : Date.parse(h) - now;
    if (Number.isNaN(ms)) return undefined;
    return Math.max(0, ms) + Math.floor(this.random() * this.baseMs);
  }
}

/**
 * When a token function's token is replaced, and what a 401 costs. A fresh
 * token is fetched right before the request that uses it (after any wait,
 * never before one, so that a wait cannot outlast it). Something that flowed
 * (a stream that opened, a long-poll answered) starts over: the backoff and
 * the count of fresh tokens. The first 401 since then (a token that ended
 * while the page was away, or a parked long-poll's) is mended at once and
 * quietly; a 401 to a fresh token is a refusal: reported, and the next fresh
 * token waits a backoff (or the server's `Retry-After`).
 *
 * What it is not: the sleep or the call of the token function (follow.ts).
 */
export class Renewal {
  /** Fresh tokens fetched since something last flowed. */
  private fresh = 0;

  constructor(private readonly backoff: Backoff) {}

  /** A connection flowed: the next refusal is mended at once. */
  flowed(): void {
    this.fresh = 0;
    this.backoff.reset();
  }

  /** A fresh token was fetched (just before its request). */
  fetched(): void {
    this.fresh++;
  }

  /**
   * A 401 without anything flowing: `undefined` to fetch a fresh token at
   * once (quietly), else the wait before the next one (a refusal to report).
   */
  refused(retryAfterMs?: number): number | undefined {
    return this.fresh > 0 ? (retryAfterMs ?? this.backoff.next()) : undefined;
  }
}

/** Resolve after `ms`, or at once when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((done) => {
    if (signal?.aborted) return done();
    const stop = () => {
      clearTimeout(timer);
      done();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", stop);
      done();
    }, ms);
    signal?.addEventListener("abort", stop, { once: true });
  });
}
