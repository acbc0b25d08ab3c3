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
