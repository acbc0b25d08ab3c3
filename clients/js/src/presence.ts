/**
 * A room's presence (docs/presence.md): who is in the room, followed as the
 * box `<room>~presence` with the follow machinery (reconnects, backoff,
 * tokens, streams and long-polls are follow.ts's), and its joins, leaves and
 * info changes found by comparing each state with the one before, by id. The
 * server sends whole states, not deltas, so a coalesced or resumed stream
 * never misses a leave: this is where the deltas are made.
 *
 * What it is not: being present. That is the follow's `member` option
 * (follow.ts), which `presence()` passes on with the others.
 */

import type { Access, Payload } from "./access";
import { follow, type Follow, type FollowHandlers, type FollowOptions } from "./follow";

/** A member present in a room, with the info it gave (if any). */
export interface Member {
  id: string;
  info?: Record<string, unknown>;
}

export interface PresenceHandlers {
  /**
   * Each new state listing its members (by id), after its `join`, `leave`
   * and `update` calls. The first state is only this: who was there before
   * the page looked did not join then.
   */
  members?(members: Member[], count: number, version: number): void;
  /** A member in this state that the last listed state did not have. */
  join?(member: Member): void;
  /** A member of the last listed state that this one does not have. */
  leave?(member: Member): void;
  /** A member in both whose info changed (a newer connection's info). */
  update?(member: Member, before: Member): void;
  /**
   * A state past the server's `presence.max_listed`: the count alone. No
   * joins or leaves while it lasts; the next listed state is compared with
   * the last listed one.
   */
  count?(count: number, version: number): void;
  mode?: FollowHandlers["mode"];
  error?: FollowHandlers["error"];
}

/** What changed between two member lists, by id. */
export interface MemberDiff {
  joined: Member[];
  left: Member[];
  /** `[now, before]` for each member whose info changed. */
  updated: [Member, Member][];
}

/** Compare two member lists by id (info compared as its JSON). */
export function diffMembers(before: readonly Member[], after: readonly Member[]): MemberDiff {
  const was = new Map(before.map((m) => [m.id, m]));
  const d: MemberDiff = { joined: [], left: [], updated: [] };
  for (const m of after) {
    const b = was.get(m.id);
    if (!b) d.joined.push(m);
    else if (JSON.stringify(b.info) !== JSON.stringify(m.info)) d.updated.push([m, b]);
    was.delete(m.id);
  }
  d.left = [...was.values()];
  return d;
}

/** The box of a room's presence: `room-17/` gives `room-17/~presence`. A
 * room is a prefix: empty, or ending with `/`, `:` or `.` (else a `TypeError`:
 * `room-17~presence` would be an ordinary key, followed in vain). */
export function presenceKey(room: string): string {
  if (!/^$|[/:.]$/.test(room)) throw new TypeError("a room is empty or ends with /, : or .: " + room);
  return room + "~presence";
}

/** Follow `room`'s presence (as a member with `o.member`). */
export function presence(access: Access, room: string, h: PresenceHandlers, o?: FollowOptions): Follow {
  let last: Member[] | undefined;
  const update = (p: Payload) => {
    const count = typeof p.count === "number" ? p.count : 0;
    const list = p.members;
    if (!Array.isArray(list)) return h.count?.(count, p.ver);
    const members = list as Member[];
    const d = last && diffMembers(last, members);
    last = members;
    if (d) {
      d.left.forEach((m) => h.leave?.(m));
      d.joined.forEach((m) => h.join?.(m));
      d.updated.forEach(([m, b]) => h.update?.(m, b));
    }
    h.members?.(members, count, p.ver);
  };
  return follow(access, presenceKey(room), { update, mode: (m) => h.mode?.(m), error: (e, f) => h.error?.(e, f) }, o);
}
