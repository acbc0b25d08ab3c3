//! The checksummed byte streams of a snapshot file: every byte written or
//! read goes into the file's CRC-32 (IEEE), except the checksum itself; the
//! reader counts offsets, so that an error says where the file is damaged,
//! and reads little-endian integers.
//!
//! What it is not: the records those bytes make (`write`, `read`).

use std::io::{self, Read, Write};

use super::error::SnapshotError;

/// One `read`, tried again when interrupted: the bytes read, 0 at the end.
pub(super) fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// A writer that adds every byte it writes to the checksum.
pub(super) struct CrcWriter<'w, W: Write> {
    pub(super) inner: &'w mut W,
    pub(super) crc: crc32fast::Hasher,
}

impl<W: Write> CrcWriter<'_, W> {
    pub(super) fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.crc.update(buf);
        self.inner.write_all(buf)
    }
}

/// A reader that adds every byte it reads to the checksum (the checksum's
/// own bytes are read unhashed) and counts its offset in the file.
pub(super) struct CrcReader<'r, R: Read> {
    pub(super) inner: &'r mut R,
    pub(super) crc: crc32fast::Hasher,
    pub(super) offset: u64,
}

impl<R: Read> CrcReader<'_, R> {
    fn fill_unhashed(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        let mut done = 0;
        while done < buf.len() {
            match read_some(self.inner, &mut buf[done..])? {
                0 => {
                    return Err(SnapshotError::Truncated {
                        offset: self.offset + done as u64,
                    })
                }
                n => done += n,
            }
        }
        self.offset += buf.len() as u64;
        Ok(())
    }

    pub(super) fn fill(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        self.fill_unhashed(buf)?;
        self.crc.update(buf);
        Ok(())
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    pub(super) fn array_unhashed<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut b = [0u8; N];
        self.fill_unhashed(&mut b)?;
        Ok(b)
    }

    pub(super) fn bytes(&mut self, len: usize) -> Result<Vec<u8>, SnapshotError> {
        let mut b = vec![0u8; len];
        self.fill(&mut b)?;
        Ok(b)
    }

    pub(super) fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(super) fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn corrupt_at(&self, offset: u64, what: &'static str) -> SnapshotError {
        SnapshotError::Corrupt { offset, what }
    }
}
