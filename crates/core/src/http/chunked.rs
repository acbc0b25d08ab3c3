//! The chunked body decoder (RFC 9112 §7.1), resumable and in place.
//!
//! Decoded bytes are moved down over the framing as they arrive, so the body
//! ends up contiguous right after the head and `raw - out` is exactly the
//! framing seen so far. Each byte is examined once, whatever the read sizes.

use std::ops::Range;

use super::{HttpError, Limits};

/// Where the decoder is in the chunked grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size,
    /// After the digits: whitespace before `;` or CR.
    SizeWs,
    /// Inside chunk extensions, skipped up to CR.
    Ext,
    /// Saw the CR ending a size line.
    SizeLf,
    /// Copying chunk data; `size` bytes left.
    Data,
    /// Data done, CR expected.
    DataCr,
    /// Data done, LF expected.
    DataLf,
    /// At the start of a trailer line, or of the blank line ending the body.
    TrailerStart,
    /// Inside a trailer field line, skipped up to CR.
    Trailer,
    /// Saw the CR ending a trailer line.
    TrailerLf,
    /// Saw the CR of the final blank line.
    EndLf,
    Done,
}

#[derive(Debug)]
pub(super) struct Dechunk {
    /// First body byte (just past the head).
    start: usize,
    /// Next encoded byte to examine.
    raw: usize,
    /// End of the decoded body so far; `out <= raw`.
    out: usize,
    state: State,
    /// Chunk size being read, then data bytes left in the chunk.
    size: u64,
    digits: u8,
    /// Decoded bytes, counting the whole of the current chunk once its size is
    /// known (so 413 comes before its data does).
    announced: u64,
    trailer_bytes: usize,
}

impl Dechunk {
    pub(super) fn new(start: usize) -> Dechunk {
        Dechunk {
            start,
            raw: start,
            out: start,
            state: State::Size,
            size: 0,
            digits: 0,
            announced: 0,
            trailer_bytes: 0,
        }
    }

    pub(super) fn raw(&self) -> usize {
        self.raw
    }

    pub(super) fn body(&self) -> Range<usize> {
        self.start..self.out
    }

    /// Decode what has arrived. `Ok(true)` once the body and its trailers are
    /// complete; `raw` is then the end of the request.
    pub(super) fn run(&mut self, buf: &mut [u8], limits: &Limits) -> Result<bool, HttpError> {
        let max_body = limits.max_body_bytes as u64;
        let max_framing = limits
            .max_body_bytes
            .saturating_add(limits.max_header_bytes);
        loop {
            // Checked before every byte, and skips below stop one byte past a
            // limit, so which error a stream gets never depends on read sizes.
            let framing = self.raw - self.out;
            if framing > max_framing {
                return Err(HttpError::ChunkFramingTooLarge);
            }
            if self.raw >= buf.len() || self.state == State::Done {
                break;
            }
            let framing_budget = (max_framing - framing).saturating_add(1);
            let b = buf[self.raw];
            match self.state {
                State::Size => match hex_value(b) {
                    Some(v) => {
                        self.digits += 1;
                        if self.digits > 16 {
                            return Err(HttpError::ChunkSizeTooLong);
                        }
                        self.size = (self.size << 4) | u64::from(v);
                        if self.announced.saturating_add(self.size) > max_body {
                            return Err(HttpError::BodyTooLarge);
                        }
                    }
                    None if self.digits == 0 => return Err(HttpError::ChunkSizeNotHex),
                    None => self.state = after_size(b)?,
                },
                State::SizeWs => self.state = after_size(b)?,
                State::Ext => {
                    // Extensions carry nothing pollbox uses: skip to CR.
                    let n = until_line_end(&buf[self.raw..]).min(framing_budget);
                    if n > 0 {
                        self.raw += n;
                        continue;
                    }
                    self.state = line_end(b)?;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(HttpError::BareCr);
                    }
                    self.announced = self.announced.saturating_add(self.size);
                    self.state = if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    };
                }
                State::Data => {
                    let avail = buf.len() - self.raw;
                    // Fits: min with `avail`, a usize.
                    let n = self.size.min(avail as u64) as usize;
                    if self.raw != self.out {
                        buf.copy_within(self.raw..self.raw + n, self.out);
                    }
                    self.raw += n;
                    self.out += n;
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::DataCr => {
                    self.state = match b {
                        b'\r' => State::DataLf,
                        b'\n' => return Err(HttpError::BareLf),
                        _ => return Err(HttpError::MissingChunkCrlf),
                    }
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(HttpError::MissingChunkCrlf);
                    }
                    self.state = State::Size;
                    self.size = 0;
                    self.digits = 0;
                }
                State::TrailerStart => {
                    self.state = match b {
                        b'\r' => State::EndLf,
                        b'\n' => return Err(HttpError::BareLf),
                        _ => State::Trailer,
                    };
                    self.count_trailer(1, limits)?;
                }
                State::Trailer => {
                    let trailer_budget =
                        (limits.max_header_bytes - self.trailer_bytes).saturating_add(1);
                    let n = until_line_end(&buf[self.raw..])
                        .min(framing_budget)
                        .min(trailer_budget);
                    if n > 0 {
                        self.count_trailer(n, limits)?;
                        self.raw += n;
                        continue;
                    }
                    self.state = match line_end(b)? {
                        State::SizeLf => State::TrailerLf,
                        other => other,
                    };
                    self.count_trailer(1, limits)?;
                }
                State::TrailerLf | State::EndLf => {
                    if b != b'\n' {
                        return Err(HttpError::BareCr);
                    }
                    self.state = if self.state == State::EndLf {
                        State::Done
                    } else {
                        State::TrailerStart
                    };
                    self.count_trailer(1, limits)?;
                }
                State::Done => break,
            }
            self.raw += 1;
        }
        Ok(self.state == State::Done)
    }

    fn count_trailer(&mut self, n: usize, limits: &Limits) -> Result<(), HttpError> {
        self.trailer_bytes += n;
        if self.trailer_bytes > limits.max_header_bytes {
            return Err(HttpError::TrailersTooLarge);
        }
        Ok(())
    }
}

/// The byte after a chunk size's digits (or after whitespace following them).
fn after_size(b: u8) -> Result<State, HttpError> {
    match b {
        // BWS before `;` (RFC 9112 §7.1.1).
        b' ' | b'\t' => Ok(State::SizeWs),
        b';' => Ok(State::Ext),
        b'\r' | b'\n' => line_end(b),
        _ => Err(HttpError::ChunkSizeNotHex),
    }
}

/// A line ending met where CRLF is the only one allowed.
fn line_end(b: u8) -> Result<State, HttpError> {
    match b {
        b'\r' => Ok(State::SizeLf),
        _ => Err(HttpError::BareLf),
    }
}

/// Bytes before the next CR or LF (all of `rest` if none).
fn until_line_end(rest: &[u8]) -> usize {
    rest.iter()
        .position(|&c| c == b'\r' || c == b'\n')
        .unwrap_or(rest.len())
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}
