//! A sub-millisecond wake-up for an event loop's thread.
//!
//! epoll's own timeout counts whole milliseconds, so an open-loop sender that waited
//! with it would send every request up to 1 ms late and report that delay as server
//! latency. On Linux a `timerfd` registered with the loop's `mio::Poll` wakes it at the
//! nanosecond; elsewhere the poll timeout is the fallback.

use std::io;
use std::time::Duration;

use mio::{Interest, Registry, Token};

/// The loop's next wake-up.
pub struct Timer {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    /// Deadline the timer is set for, in the loop's nanoseconds, while it has not fired.
    armed: Option<u64>,
}

impl Timer {
    /// A timer registered with `registry` under `token`.
    #[cfg(target_os = "linux")]
    pub fn new(registry: &Registry, token: Token) -> io::Result<Timer> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: timerfd_create takes no pointers; a non-negative result is a fresh file
        // descriptor that nothing else owns, so OwnedFd may take it.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a valid descriptor owned by no one else (see above).
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        registry.register(
            &mut mio::unix::SourceFd(&fd.as_raw_fd()),
            token,
            Interest::READABLE,
        )?;
        Ok(Timer { fd, armed: None })
    }

    /// A timer that only shapes the poll timeout.
    #[cfg(not(target_os = "linux"))]
    pub fn new(_registry: &Registry, _token: Token) -> io::Result<Timer> {
        Ok(Timer { armed: None })
    }

    /// Makes the loop wake at `deadline` (nanoseconds on the loop's clock, `now` being
    /// the current reading) and returns the timeout to give `Poll::poll`.
    pub fn arm(&mut self, deadline: u64, now: u64) -> io::Result<Option<Duration>> {
        let wait = Duration::from_nanos(deadline.saturating_sub(now));
        #[cfg(target_os = "linux")]
        {
            if self.armed != Some(deadline) {
                self.set(wait)?;
                self.armed = Some(deadline);
            }
            // The timerfd does the waking; this is only a backstop.
            Ok(Some(wait + Duration::from_millis(50)))
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.armed = Some(deadline);
            Ok(Some(wait))
        }
    }

    /// Called when the timer's token shows up in the events.
    pub fn fired(&mut self) {
        self.armed = None;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let mut expirations = [0u8; 8];
            // SAFETY: the buffer is 8 writable bytes, the size timerfd reads need; the fd
            // is open for as long as `self`. The result only says whether it had fired.
            let _ = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    expirations.as_mut_ptr().cast(),
                    expirations.len(),
                )
            };
        }
    }

    #[cfg(target_os = "linux")]
    fn set(&self, wait: Duration) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // A zero it_value would disarm the timer; a deadline already passed fires now.
        let wait = wait.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec on the stack for the duration of the call,
        // the old-value pointer may be null, and the fd is open for as long as `self`.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::time::Instant;

    #[test]
    fn wakes_the_poll_at_the_deadline_and_again_after_rearming() {
        let mut poll = Poll::new().unwrap();
        let mut timer = Timer::new(poll.registry(), Token(7)).unwrap();
        let mut events = Events::with_capacity(4);
        let start = Instant::now();
        for round in 1..=3u64 {
            let now = start.elapsed().as_nanos() as u64;
            let deadline = now + 2_000_000;
            let timeout = timer.arm(deadline, now).unwrap();
            let mut woke = false;
            while !woke {
                poll.poll(&mut events, timeout).unwrap();
                for event in events.iter() {
                    assert_eq!(event.token(), Token(7));
                    timer.fired();
                    woke = true;
                }
                if cfg!(not(target_os = "linux")) {
                    woke = true;
                }
            }
            assert!(
                start.elapsed().as_nanos() as u64 >= deadline,
                "round {round} woke before its deadline"
            );
        }
    }
}
