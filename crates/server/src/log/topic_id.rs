//! A topic's identity: the id Kafka gives a topic when it is created (a
//! UUID, Kafka ≥ 2.8), asked of the brokers with librdkafka's
//! `DescribeTopics` (rdkafka has no call for it). A topic deleted and
//! created again under the same name gets a new id, so the watermarks of a
//! node of the log, whose run is taken from it ([`run`]), name that topic
//! and no other (docs/boxes.md#watermarks).
//!
//! What it is not: the topic's check ([`super::topic`], which asks for the
//! id with the rest).

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use std::ffi::{c_char, CStr, CString};
use std::fmt;
use std::time::Duration;

/// A topic's Kafka id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicId {
    /// The UUID's two halves, most significant first.
    bits: [u64; 2],
    /// As Kafka's tools print it (URL-safe base64).
    text: String,
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl TopicId {
    /// An id of these halves (for tests).
    #[cfg(test)]
    pub(crate) fn from_bits(msb: u64, lsb: u64) -> TopicId {
        TopicId {
            bits: [msb, lsb],
            text: format!("{msb:016x}{lsb:016x}"),
        }
    }
}

/// The run of a topic's watermarks, the same on every node of the log:
/// FNV-1a of its id, or of its name where the brokers give no id.
pub(crate) fn run(id: Option<&TopicId>, name: &str) -> u64 {
    let fnv = |bytes: &mut dyn Iterator<Item = u8>| {
        bytes.fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    match id {
        Some(id) => fnv(&mut id.bits.iter().flat_map(|h| h.to_be_bytes())),
        None => fnv(&mut name.bytes()),
    }
}

/// Why the id could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IdError {
    /// The brokers say the topic does not exist.
    NoTopic,
    /// Anything else (the brokers away, a timeout): try again.
    Failed(String),
}

/// The id of `topic`, asked through `admin`'s client within `timeout`:
/// `Ok(None)` when the brokers answer without one (all zeroes: a broker
/// older than topic ids).
pub(crate) fn describe(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<TopicId>, IdError> {
    let rk = admin.inner().native_ptr();
    let name = CString::new(topic).map_err(|_| IdError::Failed("a NUL in its name".into()))?;
    let mut names = [name.as_ptr()];
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: librdkafka copies the names (`name` outlives the call).
    let topics = Owned(
        unsafe { rd::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1) },
        |p| {
            // SAFETY: made above, destroyed once when `topics` drops.
            unsafe { rd::rd_kafka_TopicCollection_destroy(p) }
        },
    );
    // SAFETY: the client is alive (`admin` is borrowed for this call).
    let options = Owned(
        unsafe {
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            )
        },
        |p| {
            // SAFETY: made above, destroyed once when `options` drops.
            unsafe { rd::rd_kafka_AdminOptions_destroy(p) }
        },
    );
    // SAFETY: as above.
    let queue = Owned(unsafe { rd::rd_kafka_queue_new(rk) }, |p| {
        // SAFETY: made above, destroyed once when `queue` drops (after the
        // event taken from it: `event` is declared later, so drops first).
        unsafe { rd::rd_kafka_queue_destroy(p) }
    });
    if topics.0.is_null() || options.0.is_null() || queue.0.is_null() {
        return Err(IdError::Failed("the client refused the request".into()));
    }
    let mut errstr = [0 as c_char; 256];
    // SAFETY: the options are alive; librdkafka writes at most
    // `errstr.len()` bytes, NUL-terminated. A timeout in range cannot fail;
    // librdkafka's default stays if it did.
    unsafe {
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.0,
            ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
    }
    // SAFETY: the client, the names, the options and the queue are alive;
    // librdkafka copies what it keeps of them, and puts its answer on the
    // queue.
    unsafe { rd::rd_kafka_DescribeTopics(rk, topics.0, options.0, queue.0) };
    // A little past the request's own timeout: the answer, or its timeout,
    // comes first.
    // SAFETY: the queue is alive; the event returned (or NULL) is destroyed
    // once, when `event` drops.
    let event = Owned(
        unsafe { rd::rd_kafka_queue_poll(queue.0, ms.saturating_add(1000)) },
        |p| {
            // SAFETY: as above.
            unsafe { rd::rd_kafka_event_destroy(p) }
        },
    );
    if event.0.is_null() {
        return Err(IdError::Failed("no answer in time".into()));
    }
    // SAFETY: the event is alive; everything read from it (the result, the
    // description, the id and its text) is its own and is copied out
    // before `event` drops.
    unsafe {
        let code = rd::rd_kafka_event_error(event.0);
        if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(IdError::Failed(text(rd::rd_kafka_event_error_string(
                event.0,
            ))));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event.0);
        if result.is_null() {
            return Err(IdError::Failed("an answer of another kind".into()));
        }
        let mut n = 0usize;
        let described = rd::rd_kafka_DescribeTopics_result_topics(result, &mut n);
        if described.is_null() || n == 0 {
            return Err(IdError::Failed("the brokers described no topic".into()));
        }
        let d = *described;
        let err = rd::rd_kafka_TopicDescription_error(d);
        if !err.is_null() {
            let code = RDKafkaErrorCode::from(rd::rd_kafka_error_code(err));
            if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                return Err(IdError::NoTopic);
            }
            if code != RDKafkaErrorCode::NoError {
                return Err(IdError::Failed(text(rd::rd_kafka_error_string(err))));
            }
        }
        let id = rd::rd_kafka_TopicDescription_topic_id(d);
        if id.is_null() {
            return Ok(None);
        }
        let bits = [
            rd::rd_kafka_Uuid_most_significant_bits(id) as u64,
            rd::rd_kafka_Uuid_least_significant_bits(id) as u64,
        ];
        if bits == [0, 0] {
            return Ok(None);
        }
        Ok(Some(TopicId {
            bits,
            text: text(rd::rd_kafka_Uuid_base64str(id)),
        }))
    }
}

/// A C string librdkafka owns, copied ("" for NULL).
///
/// # Safety
/// `s` is NULL or a NUL-terminated string alive for this call.
unsafe fn text(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// A pointer librdkafka made, released by `.1` when dropped.
struct Owned<T>(*mut T, fn(*mut T));

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            (self.1)(self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_follows_the_id_not_the_name_and_the_name_only_without_one() {
        let a = TopicId::from_bits(1, 2);
        let b = TopicId::from_bits(1, 3);
        assert_eq!(run(Some(&a), "t"), run(Some(&a), "other name"));
        assert_ne!(
            run(Some(&a), "t"),
            run(Some(&b), "t"),
            "a topic created again"
        );
        assert_eq!(run(None, "t"), run(None, "t"));
        assert_ne!(run(None, "t"), run(None, "u"));
        // The name's run is the one before topic ids were read (FNV-1a).
        assert_eq!(run(None, "a"), 0xaf63_dc4c_8601_ec8c);
    }
}
