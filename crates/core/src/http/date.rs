//! The cached `Date` header value (RFC 9110 §6.6.1), rendered once per second
//! instead of once per response.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
const IMF_FIXDATE_LEN: usize = 29;

/// The last second httpdate can render: 9999-12-31T23:59:59Z.
const LAST_SECOND: u64 = 253_402_300_799;

/// The rendered `Date` of the current second. The core has no clock: the
/// owner calls [`DateCache::update`] (once per timer tick is plenty) and reads
/// [`DateCache::get`] for each response.
#[derive(Debug, Clone)]
pub struct DateCache {
    rendered: [u8; IMF_FIXDATE_LEN],
    second: u64,
}

impl Default for DateCache {
    fn default() -> Self {
        Self::new()
    }
}

impl DateCache {
    /// Holds the Unix epoch until the first `update`.
    pub fn new() -> Self {
        let mut cache = DateCache {
            rendered: [b' '; IMF_FIXDATE_LEN],
            second: u64::MAX,
        };
        cache.update(UNIX_EPOCH);
        cache
    }

    /// Re-render only when `now` is in another second than the cached one.
    /// Times before 1970 or after 9999 are clamped (httpdate cannot render them
    /// and a wrong clock must not take the server down).
    pub fn update(&mut self, now: SystemTime) {
        let second = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .min(LAST_SECOND);
        if second == self.second {
            return;
        }
        let date = httpdate::HttpDate::from(UNIX_EPOCH + Duration::from_secs(second));
        let mut out = &mut self.rendered[..];
        // An IMF-fixdate is always 29 bytes, so this fills `rendered` exactly.
        // Were it ever not to, the second is not recorded and the next update
        // renders again.
        if write!(out, "{date}").is_ok() && out.is_empty() {
            self.second = second;
        }
    }

    /// The `Date` field value, without name or CRLF.
    pub fn get(&self) -> &[u8] {
        &self.rendered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_imf_fixdate() {
        let mut d = DateCache::new();
        assert_eq!(d.get(), b"Thu, 01 Jan 1970 00:00:00 GMT");
        d.update(UNIX_EPOCH + Duration::from_secs(784_111_777));
        assert_eq!(d.get(), b"Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn same_second_keeps_the_value_next_second_changes_it() {
        let mut d = DateCache::new();
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        d.update(t);
        d.update(t + Duration::from_millis(999));
        assert_eq!(d.get(), b"Sun, 06 Nov 1994 08:49:37 GMT");
        d.update(t + Duration::from_millis(1000));
        assert_eq!(d.get(), b"Sun, 06 Nov 1994 08:49:38 GMT");
    }

    #[test]
    fn out_of_range_clocks_are_clamped_not_panicked_on() {
        let mut d = DateCache::new();
        d.update(UNIX_EPOCH - Duration::from_secs(5));
        assert_eq!(d.get(), b"Thu, 01 Jan 1970 00:00:00 GMT");
        d.update(UNIX_EPOCH + Duration::from_secs(LAST_SECOND + 1000));
        assert_eq!(d.get(), b"Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn matches_httpdate_for_now() {
        let now = SystemTime::now();
        let mut d = DateCache::new();
        d.update(now);
        assert_eq!(d.get(), httpdate::fmt_http_date(now).as_bytes());
    }
}
