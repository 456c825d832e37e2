//! Values kept compressed: a framing for stored values that callers may use, and that readers
//! of raw values (export) understand.
//!
//! The store treats values as opaque bytes. The API server stores objects as JSON, and every
//! byte of a stored value is held in memory for as long as the version is kept (the latest
//! value of each key, the recent history and the watch cache share one buffer) and written to
//! disk with each commit. JSON objects compress about twofold with LZ4 (a running pod with its
//! `managedFields`: 3.5 KB to 1.7 KB), and decompressing one takes about a microsecond, a small
//! fraction of parsing it.
//!
//! A compressed value is a zero byte (no JSON text starts with one), the plain length as a
//! little-endian `u32`, then one LZ4 block. Any other value is plain, so values written before
//! compression, or left plain because compressing them gained nothing, read as they are.
//!
//! ```
//! use setpoint_store::compression::{compress, plain};
//!
//! let json = br#"{"kind":"Pod","metadata":{"name":"web-1","labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"nginx","imagePullPolicy":"Always"},{"name":"sidecar","image":"nginx","imagePullPolicy":"Always"}]}}"#;
//! let stored = compress(json);
//! assert!(stored.len() < json.len());
//! assert_eq!(&*plain(&stored).unwrap(), &json[..]);
//! // Plain values read as they are.
//! assert_eq!(&*plain(b"{}").unwrap(), b"{}");
//! ```

use std::borrow::Cow;
use std::cell::RefCell;

use bytes::Bytes;

/// First byte of a compressed value.
const TAG: u8 = 0;
/// Tag and plain length.
const HEADER: usize = 5;
/// Values shorter than this stay plain: too little to gain.
const MIN_COMPRESSED: usize = 96;
/// Largest plain length a compressed value may declare (any stored object is far smaller);
/// bounds what a corrupt header can make a reader allocate.
const MAX_PLAIN: usize = 256 * 1024 * 1024;
/// Scratch buffers up to this size are kept for the next call on the thread.
const KEEP_SCRATCH: usize = 256 * 1024;

/// A stored value that is not a well-formed compressed value.
#[derive(Debug, thiserror::Error)]
#[error("corrupt compressed value: {0}")]
pub struct CorruptValue(String);

thread_local! {
    /// Reused for compressing and for [`with_plain`], so neither allocates per call.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the thread's scratch buffer, taken out so that a nested call gets its own.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = SCRATCH.with_borrow_mut(std::mem::take);
    let r = f(&mut buf);
    if buf.capacity() <= KEEP_SCRATCH {
        SCRATCH.with_borrow_mut(|kept| {
            if kept.capacity() < buf.capacity() {
                *kept = buf;
            }
        });
    }
    r
}

/// The value to store for `plain`: compressed when that makes it smaller, otherwise a copy.
/// Either way the result is allocated at its exact size, since it may be kept for long.
///
/// # Panics
///
/// If `plain` starts with a zero byte and is longer than 256 MiB (it could be neither left
/// plain nor framed); no JSON text starts with a zero byte.
pub fn compress(plain: &[u8]) -> Bytes {
    // A plain value must not look compressed, so one starting with the tag is always framed.
    let must_frame = plain.first() == Some(&TAG);
    if !must_frame && (plain.len() < MIN_COMPRESSED || plain.len() > MAX_PLAIN) {
        return Bytes::copy_from_slice(plain);
    }
    assert!(plain.len() <= MAX_PLAIN, "value too large to store framed");
    with_scratch(|out| {
        out.clear();
        out.resize(
            HEADER + lz4_flex::block::get_maximum_output_size(plain.len()),
            0,
        );
        out[0] = TAG;
        out[1..HEADER].copy_from_slice(&(plain.len() as u32).to_le_bytes());
        match lz4_flex::block::compress_into(plain, &mut out[HEADER..]) {
            Ok(n) if must_frame || HEADER + n < plain.len() => {
                Bytes::copy_from_slice(&out[..HEADER + n])
            }
            _ => Bytes::copy_from_slice(plain),
        }
    })
}

/// Whether `value` is in the compressed form.
pub fn is_compressed(value: &[u8]) -> bool {
    value.first() == Some(&TAG)
}

/// The length of `value`'s plain form (for a compressed value, what its header declares).
pub fn plain_len(value: &[u8]) -> usize {
    match declared_len(value) {
        Some(n) => n,
        None => value.len(),
    }
}

fn declared_len(value: &[u8]) -> Option<usize> {
    if !is_compressed(value) {
        return None;
    }
    let len: [u8; 4] = value.get(1..HEADER)?.try_into().ok()?;
    Some(u32::from_le_bytes(len) as usize)
}

/// Decompresses `value` into `out` (cleared first).
fn decompress_into(value: &[u8], out: &mut Vec<u8>) -> Result<(), CorruptValue> {
    let len = declared_len(value)
        .filter(|&n| n <= MAX_PLAIN)
        .ok_or_else(|| CorruptValue("bad header".into()))?;
    out.clear();
    out.resize(len, 0);
    let n = lz4_flex::block::decompress_into(&value[HEADER..], out)
        .map_err(|e| CorruptValue(e.to_string()))?;
    if n != len {
        return Err(CorruptValue(format!(
            "{n} bytes where the header says {len}"
        )));
    }
    Ok(())
}

/// `value`'s plain form: borrowed when it is plain, decompressed into a new buffer otherwise.
pub fn plain(value: &[u8]) -> Result<Cow<'_, [u8]>, CorruptValue> {
    if !is_compressed(value) {
        return Ok(Cow::Borrowed(value));
    }
    let mut out = Vec::new();
    decompress_into(value, &mut out)?;
    Ok(Cow::Owned(out))
}

/// Calls `f` with `value`'s plain form, decompressing into a buffer the thread reuses: for
/// readers that only pass through it (serving a watch event, parsing a few fields).
pub fn with_plain<R>(value: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<R, CorruptValue> {
    if !is_compressed(value) {
        return Ok(f(value));
    }
    with_scratch(|buf| {
        decompress_into(value, buf)?;
        Ok(f(buf))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod_json() -> Vec<u8> {
        let labels = r#""labels":{"app":"web","pod-template-hash":"5d8f9c7b6"}"#;
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"web-5d8f9c7b6-x2x9k","namespace":"default",{labels},"managedFields":[{{"manager":"kube-controller-manager","operation":"Update","fieldsV1":{{"f:metadata":{{"f:labels":{{".":{{}},"f:app":{{}}}}}},"f:spec":{{"f:containers":{{}}}}}}}}]}},"spec":{{"containers":[{{"name":"web","image":"nginx","resources":{{}},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"Always"}}]}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn objects_compress_and_read_back() {
        let json = pod_json();
        let stored = compress(&json);
        assert!(is_compressed(&stored));
        assert!(
            stored.len() < json.len(),
            "{} of {}",
            stored.len(),
            json.len()
        );
        assert_eq!(plain_len(&stored), json.len());
        assert_eq!(&*plain(&stored).unwrap(), &json[..]);
        assert_eq!(with_plain(&stored, |p| p.to_vec()).unwrap(), json);
    }

    #[test]
    fn small_and_incompressible_values_stay_plain() {
        for value in [&b"{}"[..], b"10.0.0.1", &[7u8; 40][..]] {
            let stored = compress(value);
            assert!(!is_compressed(&stored));
            assert_eq!(&stored[..], value);
            assert_eq!(plain_len(&stored), value.len());
        }
        // Random bytes do not compress: kept as they are.
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let noise: Vec<u8> = (0..500)
            .map(|_| {
                // xorshift64
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8 | 1
            })
            .collect();
        assert_eq!(&compress(&noise)[..], &noise[..]);
    }

    #[test]
    fn nested_readers_each_get_their_own_buffer() {
        let a = compress(&pod_json());
        let mut other = pod_json();
        other.extend_from_slice(b"  ");
        let b = compress(&other);
        let both = with_plain(&a, |pa| {
            let pb = with_plain(&b, |pb| pb.to_vec()).unwrap();
            (pa.to_vec(), pb)
        })
        .unwrap();
        assert_eq!(both, (pod_json(), other));
    }

    #[test]
    fn corrupt_values_are_errors_not_panics() {
        let stored = compress(&pod_json());
        // Truncated block, truncated header, a length the block does not fill, a huge length.
        let mut huge = stored.to_vec();
        huge[1..HEADER].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut longer = stored.to_vec();
        longer[1..HEADER].copy_from_slice(&(pod_json().len() as u32 + 1).to_le_bytes());
        for bad in [
            &stored[..stored.len() - 3],
            &stored[..3],
            &[TAG][..],
            &huge[..],
            &longer[..],
        ] {
            assert!(plain(bad).is_err());
            assert!(with_plain(bad, |_| ()).is_err());
        }
    }

    proptest! {
        #[test]
        fn any_value_reads_back_as_it_was_given(value in proptest::collection::vec(any::<u8>(), 0..2000), repeat in 1usize..4) {
            // Repetition makes some of them compressible.
            let value = value.repeat(repeat);
            let stored = compress(&value);
            if value.first() != Some(&TAG) {
                prop_assert!(stored.len() <= value.len());
            }
            prop_assert_eq!(&*plain(&stored).unwrap(), &value[..]);
            prop_assert_eq!(plain_len(&stored), value.len());
        }
    }
}
