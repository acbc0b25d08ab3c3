//! The box `<room>~presence` where any box is read (docs/presence.md): its
//! payload beside the table's boxes, and the presence parameters of a
//! request. A leaf: every answer that reads a box uses it, and it uses none
//! of them.
//!
//! What it is not: joining, pages, refusals (`presence.rs`).

use super::Node;
use crate::bytes::parse_decimal;
use crate::presence::room_of;

/// The presence parameters of a request, raw (percent-encoded).
#[derive(Debug, Default, Clone, Copy)]
pub struct PresenceQuery<'a> {
    pub member: Option<&'a [u8]>,
    pub info: Option<&'a [u8]>,
    pub limit: Option<u64>,
    pub cursor: Option<&'a [u8]>,
}

/// Read `member`, `info`, `limit` and `cursor` from a query (others are
/// someone else's); each at most once.
pub fn parse_presence_query(q: &[u8]) -> Result<PresenceQuery<'_>, &'static str> {
    let mut p = PresenceQuery::default();
    for pair in q.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        let slot = match name {
            b"member" => &mut p.member,
            b"info" => &mut p.info,
            b"cursor" => &mut p.cursor,
            b"limit" => {
                if p.limit.is_some() {
                    return Err("limit given more than once");
                }
                p.limit = Some(
                    parse_decimal(value)
                        .map_err(|_| "limit is not a non-negative decimal integer")?,
                );
                continue;
            }
            _ => continue,
        };
        if slot.is_some() {
            return Err(match name {
                b"member" => "member given more than once",
                b"info" => "info given more than once",
                _ => "cursor given more than once",
            });
        }
        *slot = Some(value);
    }
    Ok(p)
}

/// What `member=` on a request that cannot be a presence connection is
/// told (a box that is no room's presence, many boxes).
pub(super) const MEMBER_WHERE: &str =
    "member= goes on a stream or long-poll of a room (?prefix=P) or of its presence (<room>~presence)";

/// Whether a query names a member (`member=`), to refuse it where it would
/// be ignored.
pub(super) fn names_member(q: &[u8]) -> bool {
    q.split(|&b| b == b'&')
        .any(|p| p.starts_with(b"member=") || p == b"member")
}

/// The payload and version of the box `key`: a room's presence
/// (`<room>~presence`), else the table's box.
#[inline]
pub(super) fn read_box(node: &Node, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
    match room_of(key) {
        Some(room) => Some(node.presence.read(room, out)),
        None => node.boxes.poll(key, out),
    }
}

/// The room a request's key names the presence of, if it does.
#[inline]
pub(super) fn presence_room(key: &[u8]) -> Option<&[u8]> {
    room_of(key)
}
