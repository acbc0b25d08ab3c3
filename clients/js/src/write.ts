/**
 * Posting: one message into a box (`POST /v1/boxes/{key}`), or a batch as
 * NDJSON (`POST /v1/ingest`), each answered with a typed result.
 *
 * A POST that may have reached the server is never sent again unless the
 * caller asks (`retry: "always"`: at-least-once). By default (`"safe"`) only
 * what pollbox refused before applying anything is retried: a 429 (after its
 * `Retry-After`), a 401 once a token function gave a fresh token, and a
 * connection refused (the runtime says so in Node, Deno and Bun; a browser
 * does not, so there a network error is returned, `maybeApplied: true`).
 *
 * What it is not: a queue. Nothing is buffered across calls.
 */

import { Access, PollboxError, boxPath, errorText, jsonBody, type Payload } from "./access";
import { Backoff, sleep } from "./backoff";
import { describe } from "./follow";

export interface PostOptions {
  /** `"safe"` (default), `"never"`, or `"always"` (may apply twice). */
  retry?: "safe" | "never" | "always";
  /** How many sends at most (default 5). */
  attempts?: number;
  signal?: AbortSignal;
}

/** A request that was not applied, or whose fate is unknown. */
export interface PostFailure {
  ok: false;
  /** The HTTP status; 0 when no answer came. */
  status: number;
  error: string;
  /** The message may be in the box all the same (no answer; a log's 503). */
  maybeApplied: boolean;
  /** How long the server asked to wait before another try, in ms. */
  retryAfterMs?: number;
}

/** One message's answer: the box's new payload. */
export type PostResult = { ok: true; status: 200; payload: Payload } | PostFailure;

/** A batch's answer: counts, and the first errors by position. */
export type BatchResult =
  | { ok: true; status: 200; accepted: number; rejected: number; errors: { i: number; error: string }[] }
  | PostFailure;

export function post(access: Access, key: string, message: object, o?: PostOptions): Promise<PostResult> {
  return send(access, boxPath(key), "application/json", JSON.stringify(message), o, (body) => ({
    ok: true,
    status: 200,
    payload: body as Payload,
  }));
}

export function postBatch(access: Access, messages: readonly object[], o?: PostOptions): Promise<BatchResult> {
  const ndjson = messages.map((m) => JSON.stringify(m) + "\n").join("");
  return send(access, "/v1/ingest", "application/x-ndjson", ndjson, o, (body) => {
    const b = body as { accepted: number; rejected: number; errors: { i: number; error: string }[] };
    return { ok: true, status: 200, accepted: b.accepted, rejected: b.rejected, errors: b.errors };
  });
}

/** A failure the runtime says never left this machine: safe to send again. */
function refusedConnection(e: unknown): boolean {
  const err = e as { code?: string; cause?: { code?: string } };
  return /ECONNREFUSED|ConnectionRefused/.test(String(err?.cause?.code ?? err?.code ?? "") + describe(e));
}

async function send<T>(
  access: Access,
  path: string,
  type: string,
  body: string,
  o: PostOptions = {},
  ok: (body: unknown) => T,
): Promise<T | PostFailure> {
  const policy = o.retry ?? "safe";
  const attempts = policy === "never" ? 1 : (o.attempts ?? 5);
  const backoff = new Backoff(access.options.backoffMs ?? 1000, access.options.maxBackoffMs ?? 30000);
  let fail: PostFailure = { ok: false, status: 0, error: "not sent", maybeApplied: false };
  for (let n = 1; n <= attempts; n++) {
    if (n > 1) await sleep(fail.retryAfterMs ?? backoff.next(), o.signal);
    if (o.signal?.aborted) return { ok: false, status: 0, error: "aborted", maybeApplied: fail.maybeApplied };
    const [url, init, token] = await access.request(path, [], {
      method: "POST",
      headers: { "Content-Type": type },
      body,
      signal: o.signal,
    });
    let res: Response;
    try {
      res = await access.fetch(url, init);
    } catch (e) {
      const refused = refusedConnection(e);
      // A failure after another try may have reached the server stays "maybe".
      fail = { ok: false, status: 0, error: describe(e), maybeApplied: fail.maybeApplied || !refused };
      if (o.signal?.aborted || !(refused || policy === "always")) return fail;
      continue;
    }
    const answer = await jsonBody(res);
    if (res.status === 200) return ok(answer);
    const unknown = res.status === 503 && errorText(answer, res) === "log unavailable";
    fail = {
      ok: false,
      status: res.status,
      error: errorText(answer, res),
      maybeApplied: fail.maybeApplied || unknown,
      retryAfterMs: backoff.retryAfter(res.headers.get("Retry-After")),
    };
    if (res.status === 401 && access.refreshable && n === 1) {
      await access.refresh(token);
      fail.retryAfterMs = 0;
      continue;
    }
    const again = res.status === 429 || (policy === "always" && res.status >= 500);
    if (!again) return fail;
  }
  return fail;
}

export { PollboxError };
