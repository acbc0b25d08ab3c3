/**
 * The pollbox client: read a box with its ETag, follow boxes (one, many, a
 * prefix) as they change, follow who is in a room (presence) and be there,
 * and post messages and batches. An ES module with
 * no runtime dependencies for browsers, Node 20+, Deno and Bun; everything
 * goes through `fetch`. docs/clients.md shows each feature.
 *
 * What it is not: a cache or a store of boxes. The page keeps what it shows;
 * the client only keeps, per followed key, the newest version it handed over.
 */

import { Access, PollboxError, boxPath, errorText, jsonBody, type ClientOptions, type Payload } from "./access";
import { follow, type Follow, type FollowHandlers, type FollowOptions, type Target } from "./follow";
import { presence, presenceKey, type Member, type PresenceHandlers } from "./presence";
import { post, postBatch, type BatchResult, type PostOptions, type PostResult } from "./write";

export type { ClientOptions, Payload, TokenOption, TokenPlacement } from "./access";
export type { Follow, FollowHandlers, FollowOptions, Mode, Target } from "./follow";
export type { Member, MemberDiff, PresenceHandlers } from "./presence";
export type { BatchResult, PostFailure, PostOptions, PostResult } from "./write";
export { PollboxError };

/** A read of one box: 200 with its payload, 304 (the ETag is current, no body), 404. */
export type ReadResult =
  | { status: 200; etag: string; payload: Payload }
  | { status: 304; etag: string }
  | { status: 404 };

/** A read of many boxes: their payloads in the order asked (`null`: none). */
export type ReadManyResult = { status: 200; etag: string; payloads: (Payload | null)[] } | { status: 304; etag: string };

/** A page of a room's members, by id: `next` goes on (`null`: the last page). */
export interface PresencePage {
  ver: number;
  count: number;
  members: Member[];
  next: string | null;
}

export interface PresencePageOptions {
  /** At most this many members (default 1000; the server caps it at `limits.max_page_boxes`). */
  limit?: number;
  /** The previous page's `next`. */
  cursor?: string;
  signal?: AbortSignal;
}

export interface ReadOptions {
  /** The ETag of the state the caller holds: 304 when it is still current. */
  etag?: string;
  signal?: AbortSignal;
}

export class Pollbox {
  private readonly access: Access;

  constructor(options: ClientOptions | string) {
    this.access = new Access(typeof options === "string" ? { url: options } : options);
  }

  /** Poll one box. Throws `PollboxError` for other answers (401, 403, 429, ...). */
  async read(key: string, o: ReadOptions = {}): Promise<ReadResult> {
    const res = await this.get(boxPath(key), [], o);
    if (res.status === 404) {
      await res.body?.cancel();
      return { status: 404 };
    }
    return this.tagged(res, o.etag) as Promise<ReadResult>;
  }

  /** Poll many boxes with one request (`GET /v1/boxes?keys=...`, at most 64). */
  async readMany(keys: readonly string[], o: ReadOptions = {}): Promise<ReadManyResult> {
    const res = await this.get("/v1/boxes", [["keys", keys.map(encodeURIComponent).join(",")]], o);
    const r = await this.tagged(res, o.etag);
    return r.status === 200 ? { status: 200, etag: r.etag, payloads: r.payload as (Payload | null)[] } : r;
  }

  /** Follow boxes as they change, until `close()` or the signal. */
  follow(target: Target, handlers: FollowHandlers, o?: FollowOptions): Follow {
    return follow(this.access, target, handlers, o);
  }

  /**
   * Follow who is in `room` (a prefix: `room-17/`): its members, their joins
   * and leaves (docs/presence.md). With `{ member, info }` the page is also
   * present in the room while it follows.
   */
  presence(room: string, handlers: PresenceHandlers, o?: FollowOptions): Follow {
    return presence(this.access, room, handlers, o);
  }

  /** One page of `room`'s members by id, past the count a presence state lists. */
  async presencePage(room: string, o: PresencePageOptions = {}): Promise<PresencePage> {
    const q: [string, string][] = [["limit", String(o.limit ?? 1000)]];
    if (o.cursor !== undefined) q.push(["cursor", encodeURIComponent(o.cursor)]);
    // No ETag is sent: the answer is a 200 (or throws).
    const r = await this.tagged(await this.get(boxPath(presenceKey(room)), q, { signal: o.signal }));
    return (r as { payload: PresencePage }).payload;
  }

  /** Post one message into the box `key`. */
  post(key: string, message: object, o?: PostOptions): Promise<PostResult> {
    return post(this.access, key, message, o);
  }

  /** Post messages as one NDJSON batch (each names its box in its key field). */
  postBatch(messages: readonly object[], o?: PostOptions): Promise<BatchResult> {
    return postBatch(this.access, messages, o);
  }

  /** A GET, sent once more after a 401 when a token function can refresh. */
  private async get(path: string, q: [string, string][], o: ReadOptions): Promise<Response> {
    const headers: Record<string, string> = o.etag ? { "If-None-Match": o.etag } : {};
    for (let n = 0; ; n++) {
      const [url, init, token] = await this.access.request(path, q, { headers, signal: o.signal });
      let res: Response;
      try {
        res = await this.access.fetch(url, init);
      } catch (e) {
        throw new PollboxError(String(e), 0);
      }
      if (res.status !== 401 || n > 0 || !this.access.refreshable) return res;
      await res.body?.cancel();
      await this.access.refresh(token);
    }
  }

  private async tagged(res: Response, etag?: string): Promise<{ status: 200; etag: string; payload: unknown } | { status: 304; etag: string }> {
    const tag = res.headers.get("ETag") ?? etag ?? "";
    if (res.status === 304) {
      await res.body?.cancel();
      return { status: 304, etag: tag };
    }
    const body = await jsonBody(res);
    if (res.status !== 200) {
      const after = res.headers.get("Retry-After");
      throw new PollboxError(errorText(body, res), res.status, after && /^\d+$/.test(after) ? Number(after) * 1000 : undefined);
    }
    return { status: 200, etag: tag, payload: body };
  }
}
