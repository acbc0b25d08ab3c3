//! What the server counts about an answer: the route label and status of every
//! response, and the result of every ingested message. Enums, not strings, so a
//! label that does not exist cannot be counted.

/// Routes as they appear in `pollbox_http_requests_total{route=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RouteLabel {
    Poll,
    LongPoll,
    /// `GET /v1/boxes/{key}` with `Accept: text/event-stream`
    /// (docs/http.md#event-streams), counted once, when the stream starts.
    Sse,
    IngestKey,
    Ingest,
    /// `DELETE /v1/boxes/{key}`.
    Delete,
    /// A CORS preflight (`OPTIONS` with `cors_origins` set).
    Preflight,
    /// A page of a prefix, `GET /v1/boxes?prefix=P` (docs/http.md#rooms).
    Page,
    /// An event stream of a prefix, counted once, when it starts.
    PrefixStream,
    Metrics,
    Healthz,
    Readyz,
    /// Unknown path, wrong method, or a request refused before routing.
    Other,
}

impl RouteLabel {
    pub const ALL: [RouteLabel; 13] = [
        RouteLabel::Poll,
        RouteLabel::LongPoll,
        RouteLabel::Sse,
        RouteLabel::IngestKey,
        RouteLabel::Ingest,
        RouteLabel::Delete,
        RouteLabel::Preflight,
        RouteLabel::Page,
        RouteLabel::PrefixStream,
        RouteLabel::Metrics,
        RouteLabel::Healthz,
        RouteLabel::Readyz,
        RouteLabel::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RouteLabel::Poll => "poll",
            RouteLabel::LongPoll => "long_poll",
            RouteLabel::Sse => "sse",
            RouteLabel::IngestKey => "ingest_key",
            RouteLabel::Ingest => "ingest",
            RouteLabel::Delete => "delete",
            RouteLabel::Preflight => "preflight",
            RouteLabel::Page => "page",
            RouteLabel::PrefixStream => "prefix_stream",
            RouteLabel::Metrics => "metrics",
            RouteLabel::Healthz => "healthz",
            RouteLabel::Readyz => "readyz",
            RouteLabel::Other => "other",
        }
    }
}

/// Results in `pollbox_ingest_messages_total{result=...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum IngestResult {
    Accepted,
    NotObject,
    BadKey,
    WrongType,
    StringTooLong,
    Overflow,
    PayloadTooLarge,
    TooManyBoxes,
    /// A body refused whole (not JSON, not an object or array).
    InvalidBody,
    /// The worker's arena was full (503 until the next epoch).
    ArenaFull,
    /// A node of a log: the log did not take or acknowledge the message in
    /// time (503; it may or may not be in the log).
    LogUnavailable,
    /// Outside the token's write scope.
    Forbidden,
}

impl IngestResult {
    pub const ALL: [IngestResult; 12] = [
        IngestResult::Accepted,
        IngestResult::NotObject,
        IngestResult::BadKey,
        IngestResult::WrongType,
        IngestResult::StringTooLong,
        IngestResult::Overflow,
        IngestResult::PayloadTooLarge,
        IngestResult::TooManyBoxes,
        IngestResult::InvalidBody,
        IngestResult::ArenaFull,
        IngestResult::LogUnavailable,
        IngestResult::Forbidden,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IngestResult::Accepted => "accepted",
            IngestResult::NotObject => "not_object",
            IngestResult::BadKey => "bad_key",
            IngestResult::WrongType => "wrong_type",
            IngestResult::StringTooLong => "string_too_long",
            IngestResult::Overflow => "overflow",
            IngestResult::PayloadTooLarge => "payload_too_large",
            IngestResult::TooManyBoxes => "too_many_boxes",
            IngestResult::InvalidBody => "invalid_body",
            IngestResult::ArenaFull => "arena_full",
            IngestResult::LogUnavailable => "log_unavailable",
            IngestResult::Forbidden => "forbidden",
        }
    }

    /// The result a rejected message is counted as.
    pub fn of(e: &crate::plan::MessageError) -> IngestResult {
        use crate::plan::MessageError as E;
        match e {
            E::NotAnObject => IngestResult::NotObject,
            E::MissingKey
            | E::KeyNotString
            | E::EmptyKey
            | E::KeyTooLong
            | E::KeyNotUtf8
            | E::ReservedKey => IngestResult::BadKey,
            E::WrongType { .. } => IngestResult::WrongType,
            E::StringTooLong { .. } => IngestResult::StringTooLong,
            E::SumOverflow { .. } => IngestResult::Overflow,
            E::PayloadTooLarge => IngestResult::PayloadTooLarge,
            E::TooManyBoxes => IngestResult::TooManyBoxes,
            E::Forbidden => IngestResult::Forbidden,
        }
    }

    /// The result a body refused whole is counted as.
    pub fn of_body(e: &crate::projection::BodyError) -> IngestResult {
        match e {
            crate::projection::BodyError::ArenaFull => IngestResult::ArenaFull,
            _ => IngestResult::InvalidBody,
        }
    }
}

/// How a box left the table, in `pollbox_boxes_deleted_total` and
/// `pollbox_boxes_expired_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Removal {
    /// `DELETE /v1/boxes/{key}`.
    Deleted,
    /// No accepted message for `ttl_s`.
    Expired,
}

impl Removal {
    pub const ALL: [Removal; 2] = [Removal::Deleted, Removal::Expired];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MessageError;

    #[test]
    fn message_errors_count_under_their_old_labels() {
        for e in [
            MessageError::NotAnObject,
            MessageError::MissingKey,
            MessageError::KeyNotUtf8,
            MessageError::ReservedKey,
            MessageError::WrongType { field: 0 },
            MessageError::StringTooLong { field: 0 },
            MessageError::SumOverflow { field: 0 },
            MessageError::PayloadTooLarge,
            MessageError::TooManyBoxes,
        ] {
            assert_eq!(IngestResult::of(&e).name(), e.metric_label(), "{e:?}");
        }
    }

    #[test]
    fn all_lists_every_variant_in_order() {
        for (i, r) in IngestResult::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        for (i, r) in RouteLabel::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        for (i, r) in Removal::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
