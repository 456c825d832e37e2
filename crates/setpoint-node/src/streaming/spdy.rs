//! A SPDY/3.1 session, as kubectl and client-go (through moby's spdystream) speak it after an
//! `Upgrade: SPDY/3.1` (or inside a WebSocket, see [`super::portforward`]): the server role
//! the agent's streaming endpoints answer with ([`serve`]), and the client role it dials a
//! container runtime's streaming server with ([`dial`], [`client`]).
//!
//! The client opens every stream (SYN_STREAM, odd ids) with a name/value header block; this
//! side accepts it with an empty SYN_REPLY, as the kubelet does, and hands it to the caller as
//! a [`Stream`]: its headers and a [`DuplexStream`] carrying its bytes. Reading that end gives
//! the client's DATA until its FIN (then EOF); writing sends DATA, and shutting the write half
//! down sends an empty DATA frame with FLAG_FIN. Header blocks are zlib streams with SPDY/3's
//! preset dictionary, one compression context per direction for the whole session, as the
//! protocol requires (a block cannot be decoded on its own). The client role is the same
//! session turned around: it opens the streams with [`Connection::open`] (SYN_STREAM, odd ids
//! from 1) and takes the server's SYN_REPLY; everything after that is shared.
//!
//! Flow control: windows are counted both ways and this side sends WINDOW_UPDATE as the
//! caller consumes a stream's bytes. spdystream, kubectl's implementation, neither sends
//! WINDOW_UPDATE nor waits for them, so the send windows are enforced only once the peer has
//! shown it does flow control (a WINDOW_UPDATE or an INITIAL_WINDOW_SIZE setting); and memory is
//! bounded not by trusting the peer's window but by backpressure: a stream's inbound queue and
//! pipe are bounded, and while they are full the session stops reading the connection.
//!
//! Bounds a hostile peer cannot exceed: [`MAX_FRAME`] per frame, [`MAX_HEADER_BLOCK`]
//! decompressed bytes per header block, [`MAX_STREAMS`] open streams, [`PIPE_BYTES`] buffered
//! per stream and direction.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, Notify};

/// The SPDY version this session speaks.
pub const VERSION: u16 = 3;
/// The largest frame payload accepted from the peer. kubectl sends data in chunks of at most
/// 32 KiB; a longer frame ends the session with a GOAWAY (PROTOCOL_ERROR).
pub const MAX_FRAME: usize = 1024 * 1024;
/// The most a decompressed header block may hold.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The most streams open at once; more are refused with RST_STREAM (REFUSED_STREAM).
pub const MAX_STREAMS: usize = 256;
/// The bytes buffered per stream and direction between the connection and the caller.
pub const PIPE_BYTES: usize = 64 * 1024;
/// SPDY/3.1's initial window, per stream and for the session.
pub const DEFAULT_WINDOW: i64 = 64 * 1024;
/// The most one DATA frame this side sends carries.
const CHUNK: usize = 32 * 1024;
/// Frames waiting for the connection's writer.
const OUTGOING: usize = 64;
/// Data frames waiting for one stream's pipe.
const INBOUND: usize = 4;
/// Accepted streams waiting for the caller.
const ACCEPT_QUEUE: usize = 16;

/// Control frame types.
pub mod kind {
    /// Opens a stream.
    pub const SYN_STREAM: u16 = 1;
    /// Accepts a stream.
    pub const SYN_REPLY: u16 = 2;
    /// Aborts a stream.
    pub const RST_STREAM: u16 = 3;
    /// Session settings.
    pub const SETTINGS: u16 = 4;
    /// Liveness, echoed by the receiver.
    pub const PING: u16 = 6;
    /// Ends the session.
    pub const GOAWAY: u16 = 7;
    /// More headers on a stream.
    pub const HEADERS: u16 = 8;
    /// Grows a flow-control window.
    pub const WINDOW_UPDATE: u16 = 9;
}

/// FLAG_FIN: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// SYN_STREAM's FLAG_UNIDIRECTIONAL: the receiver must not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// The SETTINGS id of the initial per-stream window.
const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

/// RST_STREAM status codes.
pub mod rst {
    /// Malformed or unexpected frame.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// A frame for a stream that is not open.
    pub const INVALID_STREAM: u32 = 2;
    /// The stream was refused before any processing.
    pub const REFUSED_STREAM: u32 = 3;
    /// The stream is no longer needed.
    pub const CANCEL: u32 = 5;
    /// The sender failed.
    pub const INTERNAL_ERROR: u32 = 6;
    /// The peer sent more than the window allowed.
    pub const FLOW_CONTROL_ERROR: u32 = 7;
    /// A SYN_STREAM for a stream that already exists.
    pub const STREAM_IN_USE: u32 = 8;
    /// Data after the stream's FIN.
    pub const STREAM_ALREADY_CLOSED: u32 = 9;
    /// A frame larger than the receiver takes.
    pub const FRAME_TOO_LARGE: u32 = 11;
}

/// GOAWAY status codes.
pub mod goaway {
    /// A normal end.
    pub const OK: u32 = 0;
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// This side failed.
    pub const INTERNAL_ERROR: u32 = 2;
}

/// What can go wrong decoding the peer's bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpdyError {
    /// A frame of another SPDY version.
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    /// A frame longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes is larger than the {MAX_FRAME} accepted")]
    TooLarge(usize),
    /// A frame whose payload does not fit its type.
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    /// A header block that does not decompress or decode.
    #[error("bad header block: {0}")]
    HeaderBlock(String),
}

/// Name/value headers of a stream, names lowercase (SPDY/3 requires it), in block order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The first value of `name` (compared without case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// DATA on a stream.
    Data {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// SYN_STREAM, its header block still compressed.
    SynStream {
        /// The new stream.
        stream: u32,
        /// The stream it is associated to (0 for none).
        associated: u32,
        /// Priority, 0 highest.
        priority: u8,
        /// The frame's flags.
        flags: u8,
        /// The compressed header block.
        block: Bytes,
    },
    /// SYN_REPLY.
    SynReply {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// RST_STREAM.
    RstStream {
        /// The stream.
        stream: u32,
        /// Its status code ([`rst`]).
        status: u32,
    },
    /// SETTINGS: (flags, id, value) entries.
    Settings(Vec<(u8, u32, u32)>),
    /// PING.
    Ping(u32),
    /// GOAWAY.
    GoAway {
        /// The last stream the sender processed.
        last_good: u32,
        /// Its status code ([`goaway`]).
        status: u32,
    },
    /// HEADERS.
    Headers {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// WINDOW_UPDATE (stream 0 is the session's window).
    WindowUpdate {
        /// The stream, or 0.
        stream: u32,
        /// How much the window grows.
        delta: u32,
    },
    /// A control frame type this session does not know; SPDY says to ignore it.
    Unknown(u16),
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The frame's payload length from its 8-byte header, refused past [`MAX_FRAME`].
pub fn payload_len(header: &[u8; 8]) -> Result<usize, SpdyError> {
    let len =
        (usize::from(header[5]) << 16) | (usize::from(header[6]) << 8) | usize::from(header[7]);
    if len > MAX_FRAME {
        return Err(SpdyError::TooLarge(len));
    }
    Ok(len)
}

/// Decodes one frame from its header and payload.
pub fn decode(header: &[u8; 8], payload: Bytes) -> Result<Frame, SpdyError> {
    let flags = header[4];
    if header[0] & 0x80 == 0 {
        return Ok(Frame::Data {
            stream: be32(&header[..4]) & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: payload,
        });
    }
    let version = u16::from_be_bytes([header[0] & 0x7f, header[1]]);
    if version != VERSION {
        return Err(SpdyError::Version(version));
    }
    let ty = u16::from_be_bytes([header[2], header[3]]);
    let p = &payload[..];
    let need = |n: usize, name: &'static str| {
        if p.len() < n {
            Err(SpdyError::Malformed(name))
        } else {
            Ok(())
        }
    };
    Ok(match ty {
        kind::SYN_STREAM => {
            need(10, "SYN_STREAM")?;
            Frame::SynStream {
                stream: be32(p) & 0x7fff_ffff,
                associated: be32(&p[4..]) & 0x7fff_ffff,
                priority: p[8] >> 5,
                flags,
                block: payload.slice(10..),
            }
        }
        kind::SYN_REPLY => {
            need(4, "SYN_REPLY")?;
            Frame::SynReply {
                stream: be32(p) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                block: payload.slice(4..),
            }
        }
        kind::RST_STREAM => {
            need(8, "RST_STREAM")?;
            Frame::RstStream {
                stream: be32(p) & 0x7fff_ffff,
                status: be32(&p[4..]),
            }
        }
        kind::SETTINGS => {
            need(4, "SETTINGS")?;
            let n = be32(p) as usize;
            if p.len() != 4 + n.saturating_mul(8) {
                return Err(SpdyError::Malformed("SETTINGS"));
            }
            Frame::Settings(
                p[4..]
                    .chunks_exact(8)
                    .map(|e| (e[0], be32(e) & 0x00ff_ffff, be32(&e[4..])))
                    .collect(),
            )
        }
        kind::PING => {
            need(4, "PING")?;
            Frame::Ping(be32(p))
        }
        kind::GOAWAY => {
            need(8, "GOAWAY")?;
            Frame::GoAway {
                last_good: be32(p) & 0x7fff_ffff,
                status: be32(&p[4..]),
            }
        }
        kind::HEADERS => {
            need(4, "HEADERS")?;
            Frame::Headers {
                stream: be32(p) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                block: payload.slice(4..),
            }
        }
        kind::WINDOW_UPDATE => {
            need(8, "WINDOW_UPDATE")?;
            Frame::WindowUpdate {
                stream: be32(p) & 0x7fff_ffff,
                delta: be32(&p[4..]) & 0x7fff_ffff,
            }
        }
        other => Frame::Unknown(other),
    })
}

fn control(ty: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    f.extend_from_slice(&ty.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// A DATA frame.
pub fn data_frame(stream: u32, fin: bool, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + data.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(if fin { FLAG_FIN } else { 0 });
    f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(data);
    f
}

/// A SYN_REPLY frame with an already compressed header block.
pub fn syn_reply_frame(stream: u32, fin: bool, block: &[u8]) -> Vec<u8> {
    let mut p = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    p.extend_from_slice(block);
    control(kind::SYN_REPLY, if fin { FLAG_FIN } else { 0 }, &p)
}

/// A SYN_STREAM frame with an already compressed header block (what a client sends; the
/// tests play the client with it).
pub fn syn_stream_frame(stream: u32, flags: u8, block: &[u8]) -> Vec<u8> {
    let mut p = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(block);
    control(kind::SYN_STREAM, flags, &p)
}

/// An RST_STREAM frame.
pub fn rst_frame(stream: u32, status: u32) -> Vec<u8> {
    let mut p = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    p.extend_from_slice(&status.to_be_bytes());
    control(kind::RST_STREAM, 0, &p)
}

/// A PING frame.
pub fn ping_frame(id: u32) -> Vec<u8> {
    control(kind::PING, 0, &id.to_be_bytes())
}

/// A GOAWAY frame.
pub fn goaway_frame(last_good: u32, status: u32) -> Vec<u8> {
    let mut p = (last_good & 0x7fff_ffff).to_be_bytes().to_vec();
    p.extend_from_slice(&status.to_be_bytes());
    control(kind::GOAWAY, 0, &p)
}

/// A WINDOW_UPDATE frame.
pub fn window_update_frame(stream: u32, delta: u32) -> Vec<u8> {
    let mut p = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
    control(kind::WINDOW_UPDATE, 0, &p)
}

/// A SETTINGS frame of (flags, id, value) entries.
pub fn settings_frame(entries: &[(u8, u32, u32)]) -> Vec<u8> {
    let mut p = (entries.len() as u32).to_be_bytes().to_vec();
    for (flags, id, value) in entries {
        let mut id = (id & 0x00ff_ffff).to_be_bytes();
        id[0] = *flags;
        p.extend_from_slice(&id);
        p.extend_from_slice(&value.to_be_bytes());
    }
    control(kind::SETTINGS, 0, &p)
}

/// SPDY/3's preset dictionary for header compression (its spec, section 2.6.10.1): a list of
/// length-prefixed header names and common values, then a run of plain text.
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TEXT: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
            "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
            "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
            "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
            "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,",
            "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=",
            "iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TEXT.as_bytes());
        d
    })
}

/// Plain (uncompressed) header block: a count, then length-prefixed names and values; the
/// values of a repeated name joined by NUL, as SPDY/3 carries them.
pub fn encode_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut names: Vec<(String, String)> = Vec::new();
    for (n, v) in headers {
        let n = n.to_ascii_lowercase();
        match names.iter_mut().find(|(m, _)| *m == n) {
            Some((_, joined)) => {
                joined.push('\0');
                joined.push_str(v);
            }
            None => names.push((n, v.clone())),
        }
    }
    let mut b = (names.len() as u32).to_be_bytes().to_vec();
    for (n, v) in &names {
        b.extend_from_slice(&(n.len() as u32).to_be_bytes());
        b.extend_from_slice(n.as_bytes());
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

/// Parses a plain header block.
pub fn parse_block(b: &[u8]) -> Result<Headers, SpdyError> {
    let bad = |why: &str| SpdyError::HeaderBlock(why.to_string());
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        let end = at
            .checked_add(n)
            .filter(|e| *e <= b.len())
            .ok_or_else(|| bad("truncated"))?;
        let s = &b[at..end];
        at = end;
        Ok(s)
    };
    let count = be32(take(4)?) as usize;
    let mut headers = Vec::new();
    for _ in 0..count {
        let n = be32(take(4)?) as usize;
        let name = std::str::from_utf8(take(n)?).map_err(|_| bad("name is not UTF-8"))?;
        if name.is_empty() {
            return Err(bad("empty name"));
        }
        let name = name.to_ascii_lowercase();
        let n = be32(take(4)?) as usize;
        let value = String::from_utf8_lossy(take(n)?);
        for v in value.split('\0') {
            headers.push((name.clone(), v.to_string()));
        }
    }
    Ok(Headers(headers))
}

/// The session's inbound header decompressor: one zlib stream for all of the peer's blocks.
pub struct Inflater(Decompress);

impl Default for Inflater {
    fn default() -> Self {
        Inflater(Decompress::new(true))
    }
}

impl Inflater {
    /// Decompresses and parses one block, at most [`MAX_HEADER_BLOCK`] bytes of it.
    pub fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let bad = |e: String| SpdyError::HeaderBlock(e);
        let mut out = Vec::with_capacity(1024);
        let mut input = block;
        let mut dictionary_set = false;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(bad(format!("more than {MAX_HEADER_BLOCK} bytes")));
                }
                out.reserve((out.len()).min(MAX_HEADER_BLOCK - out.len()));
            }
            let (before_in, before_out) = (self.0.total_in(), self.0.total_out());
            let result = self
                .0
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = (self.0.total_in() - before_in) as usize;
            input = &input[consumed..];
            match result {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {
                    let produced = self.0.total_out() - before_out;
                    // Done when all input is in and the output had room to spare.
                    if input.is_empty() && out.len() < out.capacity() {
                        break;
                    }
                    if consumed == 0 && produced == 0 && out.len() < out.capacity() {
                        return Err(bad("truncated".into()));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() && !dictionary_set => {
                    self.0
                        .set_dictionary(dictionary())
                        .map_err(|e| bad(e.to_string()))?;
                    dictionary_set = true;
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        }
        parse_block(&out)
    }
}

/// The session's outbound header compressor.
pub struct Deflater(Compress);

impl Default for Deflater {
    fn default() -> Self {
        let mut c = Compress::new(Compression::default(), true);
        c.set_dictionary(dictionary())
            .expect("zlib-rs accepts a dictionary before the first block");
        Deflater(c)
    }
}

impl Deflater {
    /// Compresses one block, ending it with a sync flush so the peer can decode it whole.
    pub fn block(&mut self, headers: &[(String, String)]) -> Vec<u8> {
        let plain = encode_block(headers);
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = &plain[..];
        loop {
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            let before = self.0.total_in();
            // Compressing into a Vec with room cannot fail with zlib-rs; a failure would be a
            // bug, and the block is then sent as far as it got, which the peer refuses.
            if self
                .0
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .is_err()
            {
                break;
            }
            input = &input[(self.0.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        out
    }
}

/// An accepted stream.
pub struct Stream {
    /// Its id.
    pub id: u32,
    /// Its SYN_STREAM's headers.
    pub headers: Headers,
    /// Its bytes: read the client's, write this side's; shutting down writes FLAG_FIN.
    pub io: DuplexStream,
}

/// What the writer task is asked to send.
enum Outgoing {
    /// A ready frame.
    Frame(Vec<u8>),
    /// A SYN_REPLY whose headers the writer compresses, in the order it sends them.
    Reply {
        stream: u32,
        headers: Vec<(String, String)>,
        fin: bool,
    },
    /// A client's SYN_STREAM whose headers the writer compresses, in the order it sends them.
    Syn {
        stream: u32,
        headers: Vec<(String, String)>,
    },
    /// Flush and close the connection's write half.
    Close,
}

/// A send window that callers wait on.
struct Window {
    size: Mutex<i64>,
    grown: Notify,
}

impl Window {
    fn new(size: i64) -> Arc<Window> {
        Arc::new(Window {
            size: Mutex::new(size),
            grown: Notify::new(),
        })
    }

    fn grow(&self, delta: i64) {
        *self.size.lock() += delta;
        self.grown.notify_waiters();
    }

    /// Takes up to `want` bytes of window, waiting while it is empty (only when `enforced`).
    async fn take(&self, want: usize, enforced: &AtomicBool, closed: &Notify) -> usize {
        loop {
            let notified = self.grown.notified();
            {
                let mut size = self.size.lock();
                if !enforced.load(Ordering::Acquire) {
                    *size -= want as i64;
                    return want;
                }
                if *size > 0 {
                    let n = (*size as usize).min(want);
                    *size -= n as i64;
                    return n;
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = closed.notified() => return 0,
            }
        }
    }
}

struct StreamState {
    inbound: Option<mpsc::Sender<Bytes>>,
    window: Arc<Window>,
    /// This side has sent its FLAG_FIN (or never sends: a unidirectional stream). The state
    /// goes once both sides are done, so finished streams do not count as open.
    local_done: bool,
}

/// Decides whether a stream is accepted, from its headers: an error refuses it with a
/// SYN_REPLY carrying FLAG_FIN, as the kubelet rejects a stream it cannot use.
pub type Validator = Arc<dyn Fn(&Headers) -> Result<(), String> + Send + Sync>;

struct Shared {
    out: mpsc::Sender<Outgoing>,
    /// This side is the client: it opens the streams and takes none from the peer.
    client: bool,
    validate: Validator,
    streams: Mutex<HashMap<u32, StreamState>>,
    /// The session-wide send window.
    session_window: Arc<Window>,
    /// The peer's initial per-stream window (SETTINGS INITIAL_WINDOW_SIZE).
    initial_window: Mutex<i64>,
    /// Whether the peer does flow control, so send windows are enforced.
    flow_control: AtomicBool,
    /// Notified when the connection ends, releasing window waiters.
    closed: Notify,
    /// The highest stream id the peer opened.
    last_stream: Mutex<u32>,
    /// Streams whose outbound side is still running, and a wake-up when one ends: closing
    /// the session waits for them, so what the caller wrote before it asked to close is sent.
    sending: Mutex<usize>,
    sent: Notify,
}

impl Shared {
    /// The highest stream id the peer opened (the guard is dropped before any await).
    fn last(&self) -> u32 {
        *self.last_stream.lock()
    }
}

/// A handle that ends streams or the whole session.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl Control {
    /// Aborts a stream with RST_STREAM and `status` ([`rst`]).
    pub async fn reset(&self, stream: u32, status: u32) {
        self.shared.streams.lock().remove(&stream);
        let _ = self
            .shared
            .out
            .send(Outgoing::Frame(rst_frame(stream, status)))
            .await;
    }

    /// Ends the session: a GOAWAY, then the connection's write half is closed once every
    /// frame queued before is out.
    pub async fn close(&self) {
        let last = self.shared.last();
        let _ = self
            .shared
            .out
            .send(Outgoing::Frame(goaway_frame(last, goaway::OK)))
            .await;
        let _ = self.shared.out.send(Outgoing::Close).await;
    }
}

/// A running session: on a server's, accepted streams arrive on [`Connection::accept`]; a
/// client's opens them with [`Connection::open`].
pub struct Connection {
    incoming: mpsc::Receiver<Stream>,
    control: Control,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The id of the next stream a client session opens (odd, rising); 0 on a server's.
    next_stream: u32,
}

impl Connection {
    /// The next stream the client opens; `None` once the connection has ended (at once on
    /// a client session, which takes no streams).
    pub async fn accept(&mut self) -> Option<Stream> {
        self.incoming.recv().await
    }

    /// Opens a stream with `headers` (names lowercase, as SPDY/3 requires) on a client
    /// session. The SYN_STREAM is queued before anything written on the stream, and the
    /// server's SYN_REPLY is not waited for: a stream it refuses is reset, which ends it.
    /// `None` on a server session, once ids ran out, or when the connection has ended.
    pub async fn open(&mut self, headers: Vec<(String, String)>) -> Option<Stream> {
        let shared = &self.control.shared;
        if !shared.client || self.next_stream > 0x7fff_ffff || shared.out.is_closed() {
            return None;
        }
        let id = self.next_stream;
        self.next_stream += 2;
        let stream = open_stream(shared, id, 0, Headers(headers.clone()));
        // Queued before the caller has the stream, so before any of its DATA.
        shared
            .out
            .send(Outgoing::Syn {
                stream: id,
                headers,
            })
            .await
            .ok()?;
        Some(stream)
    }

    /// A handle to reset streams or close the session.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Closes the session, within `within`: waits for every stream's outbound side to have
    /// sent what the caller wrote (a caller that shut its streams down or dropped them), then
    /// sends a GOAWAY and waits for the writer to finish.
    pub async fn close(mut self, within: std::time::Duration) {
        let shared = self.control.shared.clone();
        let _ = tokio::time::timeout(within, async {
            loop {
                let sent = shared.sent.notified();
                if *shared.sending.lock() == 0 {
                    return;
                }
                sent.await;
            }
        })
        .await;
        self.control.close().await;
        if let Some(writer) = self.tasks.pop() {
            let _ = tokio::time::timeout(within, writer).await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a server session on an upgraded connection, accepting every stream.
pub fn serve<IO>(io: IO) -> Connection
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    serve_with(io, Arc::new(|_: &Headers| Ok(())))
}

/// Starts a server session whose streams `validate` accepts or refuses.
pub fn serve_with<IO>(io: IO, validate: Validator) -> Connection
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    start(io, validate, false)
}

/// Starts a client session on an upgraded connection: it opens streams with
/// [`Connection::open`] and refuses any the server would open.
pub fn client<IO>(io: IO) -> Connection
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    start(io, Arc::new(|_: &Headers| Ok(())), true)
}

fn start<IO>(io: IO, validate: Validator, client: bool) -> Connection
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out_tx, out_rx) = mpsc::channel(OUTGOING);
    let (accept_tx, accept_rx) = mpsc::channel(ACCEPT_QUEUE);
    let shared = Arc::new(Shared {
        out: out_tx,
        client,
        validate,
        streams: Mutex::new(HashMap::new()),
        session_window: Window::new(DEFAULT_WINDOW),
        initial_window: Mutex::new(DEFAULT_WINDOW),
        flow_control: AtomicBool::new(false),
        closed: Notify::new(),
        last_stream: Mutex::new(0),
        sending: Mutex::new(0),
        sent: Notify::new(),
    });
    let reader = tokio::spawn(read_loop(read, shared.clone(), accept_tx));
    let writer = tokio::spawn(write_loop(write, out_rx));
    Connection {
        incoming: accept_rx,
        control: Control { shared },
        // The writer last: `close` waits on it.
        tasks: vec![reader, writer],
        next_stream: if client { 1 } else { 0 },
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut write: W, mut rx: mpsc::Receiver<Outgoing>) {
    let mut deflater = Deflater::default();
    while let Some(next) = rx.recv().await {
        let frame = match next {
            Outgoing::Frame(f) => f,
            Outgoing::Reply {
                stream,
                headers,
                fin,
            } => syn_reply_frame(stream, fin, &deflater.block(&headers)),
            Outgoing::Syn { stream, headers } => {
                syn_stream_frame(stream, 0, &deflater.block(&headers))
            }
            Outgoing::Close => break,
        };
        if write.write_all(&frame).await.is_err() || write.flush().await.is_err() {
            return;
        }
    }
    let _ = write.shutdown().await;
}

async fn read_frame<R: AsyncRead + Unpin>(read: &mut R) -> Option<Result<Frame, SpdyError>> {
    let mut header = [0u8; 8];
    read.read_exact(&mut header).await.ok()?;
    let len = match payload_len(&header) {
        Ok(l) => l,
        Err(e) => return Some(Err(e)),
    };
    let mut payload = vec![0u8; len];
    read.read_exact(&mut payload).await.ok()?;
    Some(decode(&header, Bytes::from(payload)))
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut read: R,
    shared: Arc<Shared>,
    accept: mpsc::Sender<Stream>,
) {
    let mut inflater = Inflater::default();
    let mut gone_away = false;
    // A client takes no streams: its `accept` ends at once.
    let accept = (!shared.client).then_some(accept);
    let send = |f: Vec<u8>| {
        let out = shared.out.clone();
        async move {
            let _ = out.send(Outgoing::Frame(f)).await;
        }
    };
    while let Some(frame) = read_frame(&mut read).await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "SPDY session ends on a bad frame");
                send(goaway_frame(shared.last(), goaway::PROTOCOL_ERROR)).await;
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream,
                flags,
                block,
                ..
            } => {
                // The block must be inflated even for a refused stream: the zlib context
                // spans the session.
                let headers = match inflater.headers(&block) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::debug!(error = %e, "SPDY session ends on a bad header block");
                        send(goaway_frame(shared.last(), goaway::PROTOCOL_ERROR)).await;
                        break;
                    }
                };
                let Some(accept) = &accept else {
                    // The server of a client session opens no streams of its own here.
                    send(rst_frame(stream, rst::REFUSED_STREAM)).await;
                    continue;
                };
                let refuse = {
                    let mut last = shared.last_stream.lock();
                    let streams = shared.streams.lock();
                    if stream % 2 == 0 || stream <= *last {
                        Some(rst::PROTOCOL_ERROR)
                    } else if gone_away || streams.len() >= MAX_STREAMS {
                        *last = stream;
                        Some(rst::REFUSED_STREAM)
                    } else {
                        *last = stream;
                        None
                    }
                };
                if let Some(status) = refuse {
                    send(rst_frame(stream, status)).await;
                    continue;
                }
                if let Err(why) = (shared.validate)(&headers) {
                    tracing::debug!(stream, %why, "refusing a SPDY stream");
                    let _ = shared
                        .out
                        .send(Outgoing::Reply {
                            stream,
                            headers: Vec::new(),
                            fin: true,
                        })
                        .await;
                    continue;
                }
                let accepted = open_stream(&shared, stream, flags, headers);
                // The reply goes out before anything the caller writes on the stream.
                let _ = shared
                    .out
                    .send(Outgoing::Reply {
                        stream,
                        headers: Vec::new(),
                        fin: false,
                    })
                    .await;
                if accept.send(accepted).await.is_err() {
                    // Nobody takes streams any more.
                    break;
                }
            }
            Frame::Data { stream, fin, data } => {
                let inbound = {
                    let mut streams = shared.streams.lock();
                    match streams.get_mut(&stream) {
                        None => None,
                        Some(s) => {
                            let tx = s.inbound.clone();
                            if fin {
                                s.inbound = None;
                                if s.local_done {
                                    // Both sides are done. The sender just cloned still
                                    // delivers this last frame.
                                    streams.remove(&stream);
                                }
                            }
                            Some(tx)
                        }
                    }
                };
                match inbound {
                    None => send(rst_frame(stream, rst::INVALID_STREAM)).await,
                    Some(None) => send(rst_frame(stream, rst::STREAM_ALREADY_CLOSED)).await,
                    Some(Some(tx)) => {
                        // A full queue stops reading the connection: the backpressure that
                        // bounds what a peer ignoring its window can make this side hold.
                        if !data.is_empty() {
                            let _ = tx.send(data).await;
                        }
                    }
                }
            }
            Frame::RstStream { stream, .. } => {
                // Dropping the state closes the inbound queue; the stream's pumps end.
                if let Some(s) = shared.streams.lock().remove(&stream) {
                    s.window.grow(i64::MAX / 4);
                }
            }
            Frame::Settings(entries) => {
                for (_, id, value) in entries {
                    if id == SETTINGS_INITIAL_WINDOW_SIZE {
                        let value = i64::from(value & 0x7fff_ffff);
                        let delta = {
                            let mut initial = shared.initial_window.lock();
                            let d = value - *initial;
                            *initial = value;
                            d
                        };
                        shared.flow_control.store(true, Ordering::Release);
                        for s in shared.streams.lock().values() {
                            s.window.grow(delta);
                        }
                    }
                }
            }
            Frame::Ping(id) => {
                // Echo the peer's pings (a client's are odd, a server's even); the others
                // would be answers to ours.
                if (id % 2 == 1) != shared.client {
                    send(ping_frame(id)).await;
                }
            }
            Frame::GoAway { .. } => {
                gone_away = true;
            }
            Frame::Headers { block, .. } | Frame::SynReply { block, .. } => {
                // Decoded to keep the zlib context in step; nothing here uses them.
                if inflater.headers(&block).is_err() {
                    send(goaway_frame(shared.last(), goaway::PROTOCOL_ERROR)).await;
                    break;
                }
            }
            Frame::WindowUpdate { stream, delta } => {
                shared.flow_control.store(true, Ordering::Release);
                if stream == 0 {
                    shared.session_window.grow(i64::from(delta));
                } else if let Some(s) = shared.streams.lock().get(&stream) {
                    s.window.grow(i64::from(delta));
                }
            }
            Frame::Unknown(_) => {}
        }
    }
    // The connection is gone: every stream's reader sees EOF, writers stop waiting.
    for (_, s) in shared.streams.lock().drain() {
        s.window.grow(i64::MAX / 4);
    }
    shared.closed.notify_waiters();
    shared.session_window.grow(i64::MAX / 4);
}

/// Registers a stream and starts the pumps between the connection and the caller's pipe.
fn open_stream(shared: &Arc<Shared>, id: u32, flags: u8, headers: Headers) -> Stream {
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (tx, rx) = mpsc::channel::<Bytes>(INBOUND);
    let window = Window::new(*shared.initial_window.lock());
    let peer_done = flags & FLAG_FIN != 0;
    shared.streams.lock().insert(
        id,
        StreamState {
            inbound: (!peer_done).then_some(tx),
            window: window.clone(),
            local_done: flags & FLAG_UNIDIRECTIONAL != 0,
        },
    );
    let (read_half, write_half) = tokio::io::split(ours);
    tokio::spawn(inbound_pump(shared.clone(), id, rx, write_half));
    if flags & FLAG_UNIDIRECTIONAL == 0 {
        *shared.sending.lock() += 1;
        let s = shared.clone();
        tokio::spawn(async move {
            outbound_pump(s.clone(), id, window, read_half).await;
            *s.sending.lock() -= 1;
            s.sent.notify_waiters();
        });
    }
    Stream {
        id,
        headers,
        io: theirs,
    }
}

/// Client DATA into the caller's pipe; WINDOW_UPDATE as it is taken; EOF at the client's FIN.
async fn inbound_pump(
    shared: Arc<Shared>,
    id: u32,
    mut rx: mpsc::Receiver<Bytes>,
    mut pipe: tokio::io::WriteHalf<DuplexStream>,
) {
    let mut unacknowledged = 0i64;
    while let Some(data) = rx.recv().await {
        if pipe.write_all(&data).await.is_err() {
            // The caller dropped its end: nothing more is wanted.
            break;
        }
        unacknowledged += data.len() as i64;
        if unacknowledged >= DEFAULT_WINDOW / 2 {
            let delta = unacknowledged as u32;
            unacknowledged = 0;
            let _ = shared
                .out
                .send(Outgoing::Frame(window_update_frame(id, delta)))
                .await;
            let _ = shared
                .out
                .send(Outgoing::Frame(window_update_frame(0, delta)))
                .await;
        }
    }
    let _ = pipe.shutdown().await;
}

/// The caller's writes as DATA frames within the send windows; FLAG_FIN at its shutdown.
async fn outbound_pump(
    shared: Arc<Shared>,
    id: u32,
    window: Arc<Window>,
    mut pipe: tokio::io::ReadHalf<DuplexStream>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut sent = 0;
        while sent < n {
            if !shared.streams.lock().contains_key(&id) {
                // Reset by the peer or the session ended.
                return;
            }
            let want = n - sent;
            let s = window
                .take(want, &shared.flow_control, &shared.closed)
                .await;
            let s = shared
                .session_window
                .take(s, &shared.flow_control, &shared.closed)
                .await;
            if s == 0 {
                return;
            }
            let frame = data_frame(id, false, &buf[sent..sent + s]);
            if shared.out.send(Outgoing::Frame(frame)).await.is_err() {
                return;
            }
            sent += s;
        }
    }
    let open = shared.streams.lock().contains_key(&id);
    if open {
        let _ = shared
            .out
            .send(Outgoing::Frame(data_frame(id, true, &[])))
            .await;
        let mut streams = shared.streams.lock();
        if let Some(s) = streams.get_mut(&id) {
            s.local_done = true;
            if s.inbound.is_none() {
                // Both sides are done.
                streams.remove(&id);
            }
        }
    }
}

/// The `Upgrade` token of SPDY/3.1.
pub const UPGRADE_TOKEN: &str = "SPDY/3.1";
/// The header naming the stream protocols a client speaks, and the one chosen.
pub const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";
/// The header listing the server's protocols when none of the client's is one.
pub const ACCEPTED_PROTOCOLS_HEADER: &str = "X-Accepted-Stream-Protocol-Versions";

/// The most bytes of an upgrade response's status line and headers [`dial`] reads.
const MAX_UPGRADE_RESPONSE: u64 = 16 * 1024;

/// Connects to `url` (plain `http://`) and upgrades the connection to SPDY/3.1 with
/// stream protocol `protocol`, as client-go's SPDY round tripper does (a POST with
/// `Connection: Upgrade`, `Upgrade: SPDY/3.1` and `X-Stream-Protocol-Version`); returns the
/// client session once the server answered 101 with that protocol.
pub async fn dial(url: &str, protocol: &str) -> Result<Connection, String> {
    use tokio::io::AsyncBufReadExt;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("unsupported URL {url:?} (only http:// is dialled)"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    let host = uri.host().unwrap_or("127.0.0.1");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let mut io = tokio::io::BufReader::new(tcp);
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n\
         Upgrade: {UPGRADE_TOKEN}\r\n{PROTOCOL_HEADER}: {protocol}\r\nContent-Length: 0\r\n\r\n"
    );
    io.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    io.flush().await.map_err(|e| e.to_string())?;
    // The response head, line by line through the buffer: what follows it is the session's.
    let mut head = Vec::new();
    let mut limited = (&mut io).take(MAX_UPGRADE_RESPONSE);
    loop {
        let before = head.len();
        let n = limited
            .read_until(b'\n', &mut head)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the server closed the connection during the upgrade".into());
        }
        if head[before..].iter().all(|b| *b == b'\r' || *b == b'\n') {
            break;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("101") {
        return Err(format!("the server refused the upgrade: {}", status.trim()));
    }
    let chosen = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case(PROTOCOL_HEADER))
        .map(|(_, value)| value.trim().to_string());
    if chosen.as_deref() != Some(protocol) {
        return Err(format!("the server chose stream protocol {chosen:?}"));
    }
    Ok(client(io))
}

/// Whether a request asks for an upgrade to SPDY/3.1 (upstream's test: the `Connection`
/// header mentions `upgrade` and the `Upgrade` header `spdy/3.1`, without case).
pub fn is_upgrade(headers: &axum::http::HeaderMap) -> bool {
    let has = |name: axum::http::header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .unwrap_or("")
                .to_ascii_lowercase()
                .contains(token)
        })
    };
    has(axum::http::header::CONNECTION, "upgrade") && has(axum::http::header::UPGRADE, "spdy/3.1")
}

/// Upstream's protocol handshake: the first of the client's `X-Stream-Protocol-Version`
/// values (in order, each header possibly a comma-separated list) that the server speaks.
/// A client naming none, or none the server speaks, is refused as upstream refuses it.
pub fn negotiate(
    headers: &axum::http::HeaderMap,
    server: &[&'static str],
) -> Result<&'static str, Box<axum::response::Response>> {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let client: Vec<String> = headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .flat_map(|v| {
            v.to_str()
                .unwrap_or("")
                .split(',')
                .map(|p| p.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
        .collect();
    if client.is_empty() {
        return Err(Box::new(super::text(
            StatusCode::BAD_REQUEST,
            format!("unable to upgrade: {PROTOCOL_HEADER} is required"),
        )));
    }
    if let Some(p) = client
        .iter()
        .find_map(|c| server.iter().find(|s| **s == c.as_str()))
    {
        return Ok(p);
    }
    let mut response = (
        StatusCode::FORBIDDEN,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{}]",
            client.join(" "),
            server.join(" ")
        ),
    )
        .into_response();
    for p in server {
        response.headers_mut().append(
            ACCEPTED_PROTOCOLS_HEADER,
            axum::http::HeaderValue::from_static(p),
        );
    }
    Err(Box::new(response))
}

/// Answers a SPDY upgrade with 101 (naming `protocol`), and runs `session` on the upgraded
/// connection once hyper hands it over.
pub fn upgrade<F, Fut>(
    mut request: axum::extract::Request,
    protocol: &'static str,
    session: F,
) -> axum::response::Response
where
    F: FnOnce(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use axum::http::{header, StatusCode};
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => session(hyper_util::rt::TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!(error = %e, "SPDY upgrade failed"),
        }
    });
    axum::response::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, UPGRADE_TOKEN)
        .header(PROTOCOL_HEADER, protocol)
        .body(axum::body::Body::empty())
        .unwrap_or_else(|e| super::text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_stream_protocol_is_the_clients_first_the_server_speaks() {
        use axum::http::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        h.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        h.append(
            PROTOCOL_HEADER,
            HeaderValue::from_static("v3.channel.k8s.io, channel.k8s.io"),
        );
        let server = ["channel.k8s.io", "v3.channel.k8s.io"];
        assert_eq!(negotiate(&h, &server).unwrap(), "v3.channel.k8s.io");
        let refused = negotiate(&h, &["portforward.k8s.io"]).unwrap_err();
        assert_eq!(refused.status(), 403);
        assert_eq!(
            refused.headers()[ACCEPTED_PROTOCOLS_HEADER],
            "portforward.k8s.io"
        );
        assert_eq!(
            negotiate(&HeaderMap::new(), &server).unwrap_err().status(),
            400
        );
        let mut up = HeaderMap::new();
        up.insert("connection", HeaderValue::from_static("Upgrade"));
        up.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        assert!(is_upgrade(&up));
        up.insert("upgrade", HeaderValue::from_static("websocket"));
        assert!(!is_upgrade(&up));
    }

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"enq=0."));
    }

    #[test]
    fn header_blocks_round_trip_across_one_zlib_context() {
        let mut deflate = Deflater::default();
        let mut inflate = Inflater::default();
        let first = h(&[("streamType", "error"), ("port", "80"), ("requestID", "0")]);
        let second = h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]);
        let a = deflate.block(&first);
        let b = deflate.block(&second);
        let got = inflate.headers(&a).unwrap();
        assert_eq!(got.get("streamtype"), Some("error"));
        assert_eq!(got.0[0].0, "streamtype", "names are lowercased");
        let got = inflate.headers(&b).unwrap();
        assert_eq!(got.get("StreamType"), Some("data"));
        assert_eq!(got.get("requestid"), Some("0"));
        // The second block depends on the first: alone it does not decode.
        assert!(Inflater::default().headers(&b).is_err());
    }

    #[test]
    fn repeated_names_are_joined_by_nul_and_split_again() {
        let block = encode_block(&h(&[("a", "1"), ("b", "x"), ("a", "2")]));
        let parsed = parse_block(&block).unwrap();
        assert_eq!(parsed.0, h(&[("a", "1"), ("a", "2"), ("b", "x")]));
        assert!(parse_block(&block[..block.len() - 1]).is_err());
        assert!(parse_block(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn a_header_block_larger_than_the_bound_is_refused() {
        let big = "x".repeat(MAX_HEADER_BLOCK + 10);
        let block = Deflater::default().block(&h(&[("n", &big)]));
        let e = Inflater::default().headers(&block).unwrap_err();
        assert!(matches!(e, SpdyError::HeaderBlock(m) if m.contains("more than")));
    }

    fn split(frame: &[u8]) -> ([u8; 8], Bytes) {
        let mut header = [0u8; 8];
        header.copy_from_slice(&frame[..8]);
        assert_eq!(payload_len(&header).unwrap(), frame.len() - 8);
        (header, Bytes::copy_from_slice(&frame[8..]))
    }

    #[test]
    fn frames_encode_and_decode() {
        let (hd, p) = split(&data_frame(5, true, b"abc"));
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::Data {
                stream: 5,
                fin: true,
                data: Bytes::from_static(b"abc")
            }
        );
        let (hd, p) = split(&rst_frame(3, rst::CANCEL));
        assert_eq!(&hd[..4], &[0x80, 0x03, 0x00, 0x03]);
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::RstStream {
                stream: 3,
                status: rst::CANCEL
            }
        );
        let (hd, p) = split(&ping_frame(7));
        assert_eq!(decode(&hd, p).unwrap(), Frame::Ping(7));
        let (hd, p) = split(&goaway_frame(9, goaway::OK));
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::GoAway {
                last_good: 9,
                status: 0
            }
        );
        let (hd, p) = split(&window_update_frame(1, 1000));
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::WindowUpdate {
                stream: 1,
                delta: 1000
            }
        );
        let (hd, p) = split(&settings_frame(&[(0, 7, 1 << 20), (1, 4, 100)]));
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::Settings(vec![(0, 7, 1 << 20), (1, 4, 100)])
        );
        let (hd, p) = split(&syn_stream_frame(1, FLAG_FIN, b"zz"));
        assert_eq!(
            decode(&hd, p).unwrap(),
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 0,
                flags: FLAG_FIN,
                block: Bytes::from_static(b"zz")
            }
        );
        let (hd, p) = split(&syn_reply_frame(1, false, b"q"));
        assert!(matches!(
            decode(&hd, p).unwrap(),
            Frame::SynReply {
                stream: 1,
                fin: false,
                ..
            }
        ));
        // Another version, a short payload, an oversized length.
        let mut v2 = ping_frame(1);
        v2[1] = 2;
        let (hd, p) = split(&v2);
        assert_eq!(decode(&hd, p), Err(SpdyError::Version(2)));
        let hd = [0x80, 3, 0, kind::PING as u8, 0, 0, 0, 2];
        assert_eq!(
            decode(&hd, Bytes::from_static(&[0, 1])),
            Err(SpdyError::Malformed("PING"))
        );
        assert!(matches!(
            payload_len(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xff]),
            Err(SpdyError::TooLarge(_))
        ));
    }

    /// The client side of a session in a test: frames out, frames in.
    struct Client {
        io: DuplexStream,
        deflate: Deflater,
        inflate: Inflater,
    }

    impl Client {
        async fn open(&mut self, id: u32, headers: &[(&str, &str)]) {
            let block = self.deflate.block(&h(headers));
            self.io
                .write_all(&syn_stream_frame(id, 0, &block))
                .await
                .unwrap();
        }

        async fn frame(&mut self) -> Frame {
            let f = read_frame(&mut self.io).await.unwrap().unwrap();
            if let Frame::SynReply { block, .. } = &f {
                self.inflate.headers(block).unwrap();
            }
            f
        }
    }

    fn pair() -> (Client, Connection) {
        let (a, b) = tokio::io::duplex(1 << 20);
        (
            Client {
                io: a,
                deflate: Deflater::default(),
                inflate: Inflater::default(),
            },
            serve(b),
        )
    }

    #[tokio::test]
    async fn streams_are_replied_to_and_carry_bytes_both_ways() {
        let (mut client, mut conn) = pair();
        client.open(1, &[("streamType", "data")]).await;
        let mut s = conn.accept().await.unwrap();
        assert_eq!(s.headers.get("streamtype"), Some("data"));
        assert!(matches!(
            client.frame().await,
            Frame::SynReply {
                stream: 1,
                fin: false,
                ..
            }
        ));
        client
            .io
            .write_all(&data_frame(1, true, b"ping"))
            .await
            .unwrap();
        let mut got = Vec::new();
        s.io.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        s.io.write_all(b"pong").await.unwrap();
        s.io.shutdown().await.unwrap();
        assert_eq!(
            client.frame().await,
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::from_static(b"pong")
            }
        );
        assert_eq!(
            client.frame().await,
            Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::new()
            }
        );
        // Pings from the client are echoed; a second stream with a used id is refused.
        client.io.write_all(&ping_frame(3)).await.unwrap();
        assert_eq!(client.frame().await, Frame::Ping(3));
        client.open(1, &[("x", "y")]).await;
        assert_eq!(
            client.frame().await,
            Frame::RstStream {
                stream: 1,
                status: rst::PROTOCOL_ERROR
            }
        );
        conn.close(std::time::Duration::from_secs(5)).await;
        assert!(matches!(
            client.frame().await,
            Frame::GoAway {
                last_good: 1,
                status: 0
            }
        ));
    }

    /// Serves one upgrade on a local port the way the agent does: a server session that
    /// echoes the `stdin` stream onto `stdout` until stdin's FIN, then writes `done` on the
    /// `error` stream and closes.
    async fn echo_server() -> std::net::SocketAddr {
        use axum::routing::post;
        async fn exec(request: axum::extract::Request) -> axum::response::Response {
            let protocol = match negotiate(request.headers(), &["v4.channel.k8s.io"]) {
                Ok(p) => p,
                Err(refused) => return *refused,
            };
            upgrade(request, protocol, |io| async move {
                let mut conn = serve(io);
                let mut streams = HashMap::new();
                while streams.len() < 3 {
                    let s = conn.accept().await.unwrap();
                    let kind = s.headers.get("streamtype").unwrap().to_string();
                    streams.insert(kind, s);
                }
                let mut stdin = streams.remove("stdin").unwrap();
                let mut stdout = streams.remove("stdout").unwrap();
                let mut error = streams.remove("error").unwrap();
                tokio::io::copy(&mut stdin.io, &mut stdout.io)
                    .await
                    .unwrap();
                stdout.io.shutdown().await.unwrap();
                error.io.write_all(b"done").await.unwrap();
                error.io.shutdown().await.unwrap();
                conn.close(std::time::Duration::from_secs(5)).await;
            })
        }
        let app = axum::Router::new().route("/exec/{token}", post(exec));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .with_upgrades()
                .await;
        });
        addr
    }

    #[tokio::test]
    async fn a_dialled_client_session_ends_stdin_with_its_fin() {
        let addr = echo_server().await;
        let mut conn = dial(&format!("http://{addr}/exec/t0k3n"), "v4.channel.k8s.io")
            .await
            .unwrap();
        let stream = |kind: &str| vec![("streamtype".to_string(), kind.to_string())];
        let mut error = conn.open(stream("error")).await.unwrap();
        let mut stdin = conn.open(stream("stdin")).await.unwrap();
        let mut stdout = conn.open(stream("stdout")).await.unwrap();
        // Odd ids from 1, in the order opened.
        assert_eq!((error.id, stdin.id, stdout.id), (1, 3, 5));
        // More than one frame and more than the default window, so windows are exercised.
        let sent: Vec<u8> = (0..3 * DEFAULT_WINDOW as usize)
            .map(|i| (i % 251) as u8)
            .collect();
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                stdin.io.write_all(&sent).await.unwrap();
                // The FIN: the server's copy ends only on it.
                stdin.io.shutdown().await.unwrap();
            })
        };
        let mut echoed = Vec::new();
        stdout.io.read_to_end(&mut echoed).await.unwrap();
        assert!(echoed == sent, "the server echoed {} bytes", echoed.len());
        let mut status = Vec::new();
        error.io.read_to_end(&mut status).await.unwrap();
        assert_eq!(status, b"done");
        writer.await.unwrap();
        // A server session opens no streams of its own.
        assert!(conn.accept().await.is_none());
    }

    #[tokio::test]
    async fn dialling_fails_on_a_refused_upgrade() {
        let addr = echo_server().await;
        let err = dial(&format!("http://{addr}/exec/t"), "v9.channel.k8s.io")
            .await
            .err()
            .unwrap();
        assert!(err.contains("403"), "{err}");
        assert!(dial("https://127.0.0.1:1/x", "v4.channel.k8s.io")
            .await
            .is_err());
    }

    #[tokio::test]
    async fn a_client_session_refuses_streams_and_answers_only_server_pings() {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut conn = client(a);
        let mut deflate = Deflater::default();
        let mut inflate = Inflater::default();
        let opened = conn.open(h(&[("streamtype", "error")])).await.unwrap();
        let f = read_frame(&mut b).await.unwrap().unwrap();
        let Frame::SynStream {
            stream: 1,
            flags: 0,
            block,
            ..
        } = f
        else {
            panic!("{f:?}")
        };
        assert_eq!(
            inflate.headers(&block).unwrap().get("streamType"),
            Some("error")
        );
        // The reply, then a stream the server opens: refused.
        b.write_all(&syn_reply_frame(1, false, &deflate.block(&[])))
            .await
            .unwrap();
        b.write_all(&syn_stream_frame(2, 0, &deflate.block(&h(&[("x", "y")]))))
            .await
            .unwrap();
        assert_eq!(
            read_frame(&mut b).await.unwrap().unwrap(),
            Frame::RstStream {
                stream: 2,
                status: rst::REFUSED_STREAM
            }
        );
        // A server's ping (even) is echoed; an odd one would answer this side's.
        b.write_all(&ping_frame(1)).await.unwrap();
        b.write_all(&ping_frame(2)).await.unwrap();
        assert_eq!(read_frame(&mut b).await.unwrap().unwrap(), Frame::Ping(2));
        // DATA after the reply reaches the stream: the zlib contexts stayed in step.
        b.write_all(&data_frame(1, true, b"status")).await.unwrap();
        let mut got = Vec::new();
        let mut io = opened.io;
        io.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"status");
        // A server session does not open streams.
        let (c, _d) = tokio::io::duplex(64);
        assert!(serve(c).open(h(&[])).await.is_none());
    }

    #[tokio::test]
    async fn closing_sends_what_streams_were_given_first() {
        let (mut client, mut conn) = pair();
        client.open(1, &[]).await;
        let mut s = conn.accept().await.unwrap();
        assert!(matches!(client.frame().await, Frame::SynReply { .. }));
        s.io.write_all(b"last words").await.unwrap();
        s.io.shutdown().await.unwrap();
        conn.close(std::time::Duration::from_secs(5)).await;
        assert_eq!(
            client.frame().await,
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::from_static(b"last words")
            }
        );
        assert!(matches!(
            client.frame().await,
            Frame::Data { fin: true, .. }
        ));
        assert!(matches!(client.frame().await, Frame::GoAway { .. }));
    }

    #[tokio::test]
    async fn finished_streams_stop_counting_against_the_limit() {
        let (mut client, mut conn) = pair();
        for i in 0..(MAX_STREAMS as u32 + 10) {
            let id = 2 * i + 1;
            client.open(id, &[]).await;
            let mut s = tokio::time::timeout(std::time::Duration::from_secs(10), conn.accept())
                .await
                .expect("accepted, not refused")
                .unwrap();
            assert!(matches!(client.frame().await, Frame::SynReply { .. }));
            if i % 2 == 0 {
                // This side first, then the client.
                s.io.shutdown().await.unwrap();
                assert!(matches!(
                    client.frame().await,
                    Frame::Data { fin: true, .. }
                ));
                client
                    .io
                    .write_all(&data_frame(id, true, b""))
                    .await
                    .unwrap();
            } else {
                // The client first.
                client
                    .io
                    .write_all(&data_frame(id, true, b""))
                    .await
                    .unwrap();
                let mut rest = Vec::new();
                s.io.read_to_end(&mut rest).await.unwrap();
                s.io.shutdown().await.unwrap();
                assert!(matches!(
                    client.frame().await,
                    Frame::Data { fin: true, .. }
                ));
            }
        }
    }

    #[tokio::test]
    async fn send_windows_hold_once_the_peer_does_flow_control() {
        let (mut client, mut conn) = pair();
        // The peer announces a 10-byte initial window: this side is held to it.
        client
            .io
            .write_all(&settings_frame(&[(0, SETTINGS_INITIAL_WINDOW_SIZE, 10)]))
            .await
            .unwrap();
        client.open(1, &[]).await;
        let mut s = conn.accept().await.unwrap();
        assert!(matches!(client.frame().await, Frame::SynReply { .. }));
        s.io.write_all(&[7u8; 25]).await.unwrap();
        let Frame::Data { data, .. } = client.frame().await else {
            panic!("expected data")
        };
        assert_eq!(data.len(), 10);
        // Nothing more until the window grows.
        let more = tokio::time::timeout(std::time::Duration::from_millis(100), client.frame());
        assert!(more.await.is_err());
        client
            .io
            .write_all(&window_update_frame(1, 100))
            .await
            .unwrap();
        let Frame::Data { data, .. } = client.frame().await else {
            panic!("expected data")
        };
        assert_eq!(data.len(), 15);
    }

    #[tokio::test]
    async fn consumed_bytes_are_acknowledged_with_window_updates() {
        let (mut client, mut conn) = pair();
        client.open(1, &[]).await;
        let mut s = conn.accept().await.unwrap();
        assert!(matches!(client.frame().await, Frame::SynReply { .. }));
        let chunk = vec![1u8; 16 * 1024];
        for _ in 0..2 {
            client
                .io
                .write_all(&data_frame(1, false, &chunk))
                .await
                .unwrap();
        }
        let mut got = vec![0u8; 32 * 1024];
        s.io.read_exact(&mut got).await.unwrap();
        assert_eq!(
            client.frame().await,
            Frame::WindowUpdate {
                stream: 1,
                delta: 32 * 1024
            }
        );
        assert_eq!(
            client.frame().await,
            Frame::WindowUpdate {
                stream: 0,
                delta: 32 * 1024
            }
        );
    }

    #[tokio::test]
    async fn a_reset_stream_ends_and_an_oversized_frame_ends_the_session() {
        let (mut client, mut conn) = pair();
        client.open(1, &[]).await;
        let mut s = conn.accept().await.unwrap();
        assert!(matches!(client.frame().await, Frame::SynReply { .. }));
        client
            .io
            .write_all(&rst_frame(1, rst::CANCEL))
            .await
            .unwrap();
        let mut got = Vec::new();
        s.io.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
        client
            .io
            .write_all(&[0, 0, 0, 1, 0, 0x7f, 0xff, 0xff])
            .await
            .unwrap();
        assert!(matches!(
            client.frame().await,
            Frame::GoAway {
                status: goaway::PROTOCOL_ERROR,
                ..
            }
        ));
        assert!(conn.accept().await.is_none());
    }
}
