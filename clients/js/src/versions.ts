/**
 * What the page has been handed, box by box: the newest version of each key
 * and whether the box is there now. It is the gate that keeps the page from
 * ever getting an older version after a newer one, whatever a reconnect, a
 * node change or a restart sends again; and it writes the resume id of a
 * stream of many boxes from what the page has, not from what a server said.
 *
 * What it is not: a cache of payloads. Only versions are kept (a number and
 * a flag per key).
 */

import type { Payload } from "./access";

export class Versions {
  /** The newest version handed over per key; kept after a deletion, since
   * a key created again starts past every version it served. */
  private readonly newest = new Map<string, number>();
  private readonly present = new Set<string>();

  /** Take `p` if it is newer than what the page has of its key. */
  accept(p: Payload): boolean {
    const before = this.newest.get(p.k);
    if (before !== undefined && !(p.ver > before)) return false;
    this.newest.set(p.k, p.ver);
    this.present.add(p.k);
    return true;
  }

  /** The box `key` is gone: true if the page had it (report it once). */
  remove(key: string): boolean {
    return this.present.delete(key);
  }

  /** The newest version of `key` handed over, while the page has the box. */
  version(key: string): number | undefined {
    return this.present.has(key) ? this.newest.get(key) : undefined;
  }

  has(key: string): boolean {
    return this.present.has(key);
  }

  /** The keys whose boxes the page has now (a copy). */
  held(): string[] {
    return [...this.present];
  }

  /**
   * The `Last-Event-ID` of a stream of `keys` (docs/http.md, many boxes):
   * each box's version in hexadecimal, empty for one the page does not have,
   * in the order of the keys. `""` when the page has none of them.
   */
  resumeId(keys: readonly string[]): string {
    let any = false;
    const parts = keys.map((k) => {
      const v = this.present.has(k) ? this.newest.get(k) : undefined;
      if (v === undefined) return "";
      any = true;
      return v.toString(16);
    });
    return any ? parts.join(",") : "";
  }
}
