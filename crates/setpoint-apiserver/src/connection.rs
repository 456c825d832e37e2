//! The connection layer: how an accepted connection becomes requests for the router, with the
//! limits and timeouts that keep one client from holding a connection (and its buffers)
//! forever.
//!
//! hyper speaks HTTP/1.1 and HTTP/2. On HTTP/1.1 every request head passes through
//! [`Guarded`] before hyper sees it: the guard finds where each head ends (following the
//! body framing of the request before it), checks the head against [`ConnectionConfig`]'s
//! limits with the parser hyper itself uses, and times out idle connections and slow heads. A
//! head hyper would refuse with an empty answer (400, 414, 431) is never shown to hyper: the
//! guard hands it a placeholder request instead, the service answers that one with a
//! `Status` explaining the refusal, and the connection closes.
//!
//! Request bodies are bounded by [`read_body`] (size and time), on both protocols; responses
//! are never timed, so watches and other long-running responses stream as long as they like.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::authentication::Identity;
use axum::body::Body;
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use futures::task::AtomicWaker;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use setpoint_api::ApiError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tower::ServiceExt;

/// Limits and timeouts of client connections. The defaults are kube-apiserver's, which serves
/// with Go's `net/http`:
///
/// | field | default | upstream |
/// |---|---|---|
/// | `tls_handshake_timeout` | 32 s | Go bounds the TLS handshake by the smallest of the server's `ReadTimeout`, `ReadHeaderTimeout` and `WriteTimeout` that is set; kube-apiserver sets only `ReadHeaderTimeout`, 32 s |
/// | `header_read_timeout` | 32 s | `ReadHeaderTimeout: 32 * time.Second`, "just shy of requestTimeoutUpperBound"; runs from the connection's start for its first request, from the first byte of a head for later ones |
/// | `idle_timeout` | 90 s | `IdleTimeout: 90 * time.Second` on `http.Server` and `http2.Server` ("matches http.DefaultTransport keep-alive timeout"): a connection with no request in progress for this long is closed |
/// | `body_read_timeout` | 60 s | `--request-timeout` (default `1m0s`): a request body not read in full by then is answered 504 `Timeout` "Timeout: request did not complete within requested timeout - context deadline exceeded" |
/// | `max_header_bytes` | 1 MiB | `MaxHeaderBytes: 1 << 20` (the request line and headers; Go allows 4 KiB of read-buffer slack on top); more is answered 431 |
/// | `max_headers` | 256 | Go counts only bytes; hyper needs a count and defaults to 100. Clients send about ten, impersonation and tracing add a few more; more is answered 431 |
/// | `max_uri_bytes` | 65,534 | Go has no limit of its own beyond `max_header_bytes`; this is the longest URI hyper can hold, so it is also the most this may be set to; more is answered 414 |
/// | `http2_max_concurrent_streams` | 250 | `--http2-max-streams-per-connection`, default 0, which kube-apiserver serves as "the default of 250" made explicit (aggregated API servers raise it to 1000) |
///
/// Request body size is `ServerConfig::max_body_bytes` (3 MiB, kube-apiserver's
/// `MaxRequestBodyBytes`), answered 413.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// How long a TLS client may take to finish the handshake.
    pub tls_handshake_timeout: Duration,
    /// How long a client may take to send a request head (request line and headers).
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in progress.
    pub idle_timeout: Duration,
    /// How long a handler waits for a request body to arrive in full.
    pub body_read_timeout: Duration,
    /// Largest request head (request line plus headers), in bytes.
    pub max_header_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Longest request URI, in bytes (at most [`MAX_URI_BYTES`]).
    pub max_uri_bytes: usize,
    /// Most concurrent requests (streams) on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
}

/// The longest URI hyper can represent (`http::Uri` keeps offsets as `u16`).
pub const MAX_URI_BYTES: usize = u16::MAX as usize - 1;

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            tls_handshake_timeout: Duration::from_secs(32),
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            body_read_timeout: Duration::from_secs(60),
            max_header_bytes: 1 << 20,
            max_headers: 256,
            max_uri_bytes: MAX_URI_BYTES,
            http2_max_concurrent_streams: 250,
        }
    }
}

/// Reads a whole request body: at most `limit` bytes (413 beyond), within `timeout` (504), and
/// a body that cannot be decoded (a malformed chunked encoding, a connection that ends early)
/// is a 400.
pub async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(body_error(&e, limit)),
        Err(_) => Err(request_timeout()),
    }
}

/// The `Status` for a body that could not be read: 413 when it was over `limit`, else 400 with
/// the innermost cause (what hyper found wrong with the bytes).
fn body_error(e: &(dyn std::error::Error + 'static), limit: usize) -> ApiError {
    let mut cause: &(dyn std::error::Error + 'static) = e;
    loop {
        if cause.is::<http_body_util::LengthLimitError>() {
            return ApiError::too_large(format!("Request entity too large: limit is {limit}"));
        }
        match cause.source() {
            Some(next) => cause = next,
            None => break,
        }
    }
    ApiError::bad_request(format!("error reading the request body: {cause}"))
}

/// kube-apiserver's answer to a request that outlived `--request-timeout` (`NewTimeoutError`,
/// whose details are present but empty).
fn request_timeout() -> ApiError {
    let mut e = ApiError::timeout(
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
    );
    e.details = Some(Box::default());
    e
}

/// The address a request's connection came from (a request extension; audit events'
/// `sourceIPs` end with it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerAddr(pub std::net::SocketAddr);

/// Serves one accepted connection (after the TLS handshake, if any) until it ends. `http2` is
/// true when TLS negotiated `h2`, so no HTTP/1.1 head will come.
pub(crate) async fn serve_connection<I>(
    io: I,
    router: Router,
    identity: Identity,
    peer: std::net::SocketAddr,
    config: &ConnectionConfig,
    http2: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let io = Guarded::new(io, config, shared.clone(), http2);
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        // Counted before anything else, so the guard's idle timer never runs while a request
        // is in progress; the count drops when the response body is done (or dropped).
        let active = Active::new(shared.clone());
        let n = shared.requests.fetch_add(1, Ordering::SeqCst);
        let refused = shared.take_refusal(n);
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(identity.clone());
        req.extensions_mut().insert(PeerAddr(peer));
        let router = router.clone();
        async move {
            let response = match refused {
                Some(e) => {
                    let mut r = crate::response::error_response(&e);
                    r.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    r
                }
                None => router.oneshot(req).await.unwrap_or_else(|e| match e {}),
            };
            Ok::<_, Infallible>(response.map(|body| Tracked {
                body,
                _active: active,
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // The guard has already checked every head against the limits; hyper's own must only
        // be wide enough to let those heads through.
        .max_headers(config.max_headers.max(1))
        .max_buf_size(config.max_header_bytes.max(8192) + 8192);
    builder
        .http2()
        .max_concurrent_streams(config.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// What the service and the guard of one connection share.
#[derive(Default)]
struct Shared {
    /// Requests whose response is not finished yet.
    active: AtomicUsize,
    /// Requests the service has been called for.
    requests: AtomicU64,
    /// Woken when `active` drops to zero, so the guard starts its idle timer.
    idle: AtomicWaker,
    /// A head the guard refused: (the request number of its placeholder, the answer).
    refused: parking_lot::Mutex<Option<(u64, ApiError)>>,
}

impl Shared {
    fn take_refusal(&self, n: u64) -> Option<ApiError> {
        let mut refused = self.refused.lock();
        match &*refused {
            Some((at, _)) if *at == n => refused.take().map(|(_, e)| e),
            _ => None,
        }
    }
}

/// One request in progress (see [`Shared::active`]).
struct Active(Arc<Shared>);

impl Active {
    fn new(shared: Arc<Shared>) -> Active {
        shared.active.fetch_add(1, Ordering::SeqCst);
        Active(shared)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.wake();
        }
    }
}

/// A response body that keeps its request counted as in progress until hyper is done with it.
struct Tracked {
    body: Body,
    _active: Active,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The first bytes of an HTTP/2 connection without TLS (prior knowledge).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the guard hands hyper in place of a refused head: a request it accepts, after which it
/// closes the connection.
const PLACEHOLDER: &[u8] = b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n";

/// What the guard is reading.
#[derive(Debug)]
enum Mode {
    /// An HTTP/1.1 request head (or nothing yet).
    Head,
    /// The body of the head just passed on.
    Body(Framing),
    /// HTTP/2: passed through, only the idle timeout applies.
    Http2,
    /// After an upgrade (or a body framing the guard could not follow, which hyper fails too):
    /// passed through untouched, without timers.
    Raw,
    /// After a refused head: the rest of the input is ignored. Reads stay pending rather
    /// than end, because hyper drops a request whose client has stopped sending before it is
    /// answered, and the placeholder must be answered.
    Refused,
    /// The input has ended.
    Closed,
}

/// Which timer is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Header,
    Idle,
}

/// The connection as hyper reads it (see the module docs). Writes pass straight through.
struct Guarded<I> {
    io: I,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    limits: HeadLimits,
    shared: Arc<Shared>,
    mode: Mode,
    /// Read from the connection, not yet passed on.
    pending: BytesMut,
    /// How far `pending` has been searched for the end of a head.
    scanned: usize,
    /// Passed on, not yet read by hyper.
    ready: Bytes,
    /// Heads passed on so far (placeholders included).
    heads: u64,
    timer: Option<(Timer, Pin<Box<Sleep>>)>,
    /// How long to keep draining after a refusal (see `poll_shutdown`).
    linger: Option<Pin<Box<Sleep>>>,
}

impl<I> Guarded<I> {
    fn new(io: I, config: &ConnectionConfig, shared: Arc<Shared>, http2: bool) -> Self {
        Guarded {
            io,
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            limits: HeadLimits {
                max_header_bytes: config.max_header_bytes,
                max_headers: config.max_headers.max(1),
                max_uri_bytes: config.max_uri_bytes.min(MAX_URI_BYTES),
            },
            shared,
            mode: if http2 { Mode::Http2 } else { Mode::Head },
            pending: BytesMut::new(),
            scanned: 0,
            ready: Bytes::new(),
            heads: 0,
            timer: None,
            linger: None,
        }
    }

    /// Starts `kind`'s timer unless it is already the one running.
    fn arm(&mut self, kind: Timer) {
        if !matches!(&self.timer, Some((k, _)) if *k == kind) {
            let after = match kind {
                Timer::Header => self.header_read_timeout,
                Timer::Idle => self.idle_timeout,
            };
            self.timer = Some((kind, Box::pin(tokio::time::sleep(after))));
        }
    }

    /// Whether the running timer (if any) has fired; registers for its wake-up if not.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<Timer> {
        let (kind, sleep) = self.timer.as_mut()?;
        sleep.as_mut().poll(cx).is_ready().then_some(*kind)
    }

    /// Starts the timer that applies while waiting for bytes of a head. As in Go, a head is
    /// timed only once the server is ready to read it: from the connection's start for the
    /// first, after the response before it for the others (a client may send the next head
    /// early, behind a long watch, without being cut off). A head that has begun gets the
    /// header timeout; an idle connection the idle timeout.
    fn arm_for_head(&mut self, cx: &mut Context<'_>) {
        if self.heads == 0 {
            self.arm(Timer::Header);
            return;
        }
        // Registered before looking, so a response that finishes in between still wakes us.
        self.shared.idle.register(cx.waker());
        if self.shared.active.load(Ordering::SeqCst) > 0 {
            self.timer = None;
        } else if self.pending.is_empty() {
            self.arm(Timer::Idle);
        } else {
            self.arm(Timer::Header);
        }
    }

    /// The idle timer runs only while no request is in progress.
    fn arm_idle(&mut self, cx: &mut Context<'_>) {
        // Registered before looking, so a response that finishes in between still wakes us.
        self.shared.idle.register(cx.waker());
        if self.shared.active.load(Ordering::SeqCst) == 0 {
            self.arm(Timer::Idle);
        } else {
            self.timer = None;
        }
    }

    /// Passes on the head at the start of `pending` (its end is known), or the placeholder if
    /// the head is refused.
    fn take_head(&mut self, outcome: HeadOutcome) {
        self.scanned = 0;
        self.timer = None;
        match outcome {
            HeadOutcome::Accept {
                len,
                framing,
                upgrade,
            } => {
                self.ready = self.pending.split_to(len).freeze();
                self.heads += 1;
                self.mode = if upgrade {
                    Mode::Raw
                } else {
                    match framing {
                        Some(f) => Mode::Body(f),
                        None => Mode::Head,
                    }
                };
            }
            HeadOutcome::Refuse(e) => {
                tracing::debug!(code = e.code, message = %e.message, "refused a request head");
                *self.shared.refused.lock() = Some((self.heads, e));
                self.heads += 1;
                self.pending.clear();
                self.ready = Bytes::from_static(PLACEHOLDER);
                self.mode = Mode::Refused;
            }
        }
    }
}

impl<I: AsyncRead + Unpin> Guarded<I> {
    /// Reads more of the connection into `pending`: the number of bytes (0 at end of input).
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut chunk = [0u8; 16 * 1024];
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                self.pending.extend_from_slice(buf.filled());
                Poll::Ready(Ok(buf.filled().len()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out(kind: Timer) -> io::Error {
    let what = match kind {
        Timer::Header => "reading the request head timed out",
        Timer::Idle => "the connection was idle too long",
    };
    io::Error::new(io::ErrorKind::TimedOut, what)
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = dst.remaining().min(this.ready.len());
                dst.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            match &mut this.mode {
                Mode::Closed => return Poll::Ready(Ok(())),
                // The placeholder's `connection: close` ends the connection once answered.
                Mode::Refused => return Poll::Pending,
                Mode::Raw | Mode::Http2 if !this.pending.is_empty() => {
                    this.ready = this.pending.split().freeze();
                }
                Mode::Raw => return Pin::new(&mut this.io).poll_read(cx, dst),
                Mode::Http2 => {
                    this.arm_idle(cx);
                    let before = dst.filled().len();
                    match Pin::new(&mut this.io).poll_read(cx, dst) {
                        Poll::Pending => {}
                        Poll::Ready(Ok(())) if dst.filled().len() == before => {
                            return Poll::Ready(Ok(()))
                        }
                        other => return other,
                    }
                    return match this.expired(cx) {
                        Some(kind) => Poll::Ready(Err(timed_out(kind))),
                        None => Poll::Pending,
                    };
                }
                Mode::Body(framing) if !this.pending.is_empty() => {
                    match framing.advance(&this.pending) {
                        Ok((n, done)) => {
                            this.ready = this.pending.split_to(n).freeze();
                            if done {
                                this.mode = Mode::Head;
                            }
                        }
                        // hyper fails this body too, and with it the connection; pass the
                        // bytes on so that it does.
                        Err(()) => this.mode = Mode::Raw,
                    }
                }
                Mode::Body(_) => match this.fill(cx) {
                    Poll::Ready(Ok(0)) => this.mode = Mode::Closed,
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
                Mode::Head => {
                    if this.heads == 0 && this.pending.starts_with(H2_PREFACE) {
                        this.mode = Mode::Http2;
                        continue;
                    }
                    let maybe_h2 = this.heads == 0
                        && !this.pending.is_empty()
                        && H2_PREFACE.starts_with(&this.pending);
                    if !this.pending.is_empty() && !maybe_h2 {
                        if let Some(outcome) = this.check_pending() {
                            this.take_head(outcome);
                            continue;
                        }
                    }
                    this.arm_for_head(cx);
                    match this.fill(cx) {
                        Poll::Ready(Ok(0)) => this.mode = Mode::Closed,
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            return match this.expired(cx) {
                                Some(kind) => Poll::Ready(Err(timed_out(kind))),
                                None => Poll::Pending,
                            }
                        }
                    }
                }
            }
        }
    }
}

impl<I> Guarded<I> {
    /// Looks at `pending` for a complete head: `None` while more bytes are needed.
    fn check_pending(&mut self) -> Option<HeadOutcome> {
        // A head ends at an empty line (CRLF CRLF, or bare LFs, which httparse also accepts);
        // parse only once one has arrived, so a head sent a byte at a time is not parsed a
        // million times.
        let from = self.scanned.saturating_sub(3);
        let end = find_head_end(&self.pending[from..]).map(|e| from + e);
        self.scanned = self.pending.len();
        match end {
            Some(_) => check_head(&self.pending, &self.limits),
            None if self.pending.len() > self.limits.max_header_bytes => {
                Some(HeadOutcome::Refuse(header_too_large(&self.limits)))
            }
            None => None,
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
        if !matches!(this.mode, Mode::Refused) {
            return Poll::Ready(Ok(()));
        }
        // A refused request may still be arriving (a huge header, say). Closing a socket with
        // unread input makes the kernel reset the connection, and the client may then lose
        // the answer it has not read yet; so, as Go's server does, read and drop the input
        // for a moment after our side is shut down.
        let linger = this
            .linger
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(REFUSAL_LINGER)));
        if linger.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        loop {
            this.pending.clear();
            match this.fill(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// How long a connection whose request was refused keeps draining its input after the answer
/// (Go's `rstAvoidanceDelay`).
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// Where the first empty line in `buf` ends, if there is one.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| i + 2)
        .into_iter()
        .chain(buf.windows(3).position(|w| w == b"\n\r\n").map(|i| i + 3))
        .min()
}

/// The limits a request head is checked against.
#[derive(Clone, Debug)]
struct HeadLimits {
    max_header_bytes: usize,
    max_headers: usize,
    max_uri_bytes: usize,
}

/// What to do with a complete request head.
#[derive(Debug)]
enum HeadOutcome {
    /// Pass on its `len` bytes; a body follows (`framing`) or not; after it the connection
    /// may stop being HTTP (`upgrade`).
    Accept {
        len: usize,
        framing: Option<Framing>,
        upgrade: bool,
    },
    /// Answer with this `Status` and close.
    Refuse(ApiError),
}

/// The parts of a parsed head the checks need.
struct ParsedHead {
    len: usize,
    method: Vec<u8>,
    path: Vec<u8>,
    http11: bool,
    /// Transfer-Encoding and Content-Length values, and whether an Upgrade header was sent,
    /// in order.
    framing_headers: Vec<(FramingHeader, Vec<u8>)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FramingHeader {
    TransferEncoding,
    ContentLength,
    Upgrade,
}

fn parse_head(
    buf: &[u8],
    max_headers: usize,
) -> Result<httparse::Status<ParsedHead>, httparse::Error> {
    let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(httparse::Status::Partial),
    };
    let framing_headers = req
        .headers
        .iter()
        .filter_map(|h| {
            let which = if h.name.eq_ignore_ascii_case("transfer-encoding") {
                FramingHeader::TransferEncoding
            } else if h.name.eq_ignore_ascii_case("content-length") {
                FramingHeader::ContentLength
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                FramingHeader::Upgrade
            } else {
                return None;
            };
            Some((which, h.value.to_vec()))
        })
        .collect();
    Ok(httparse::Status::Complete(ParsedHead {
        len,
        method: req.method.unwrap_or_default().as_bytes().to_vec(),
        path: req.path.unwrap_or_default().as_bytes().to_vec(),
        http11: req.version == Some(1),
        framing_headers,
    }))
}

/// Checks a head that has ended in `buf` the way hyper will (same parser, same rules for
/// the body's framing), so that every head accepted here is one hyper accepts, and answers
/// what hyper would refuse with a `Status`.
fn check_head(buf: &[u8], limits: &HeadLimits) -> Option<HeadOutcome> {
    // Most requests carry a few headers: try a small table first.
    let small = limits.max_headers.min(32);
    let parsed = match parse_head(buf, small) {
        Err(httparse::Error::TooManyHeaders) if small < limits.max_headers => {
            parse_head(buf, limits.max_headers)
        }
        other => other,
    };
    let head = match parsed {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) if buf.len() > limits.max_header_bytes => {
            return Some(HeadOutcome::Refuse(header_too_large(limits)))
        }
        Ok(httparse::Status::Partial) => return None,
        Err(httparse::Error::TooManyHeaders) => {
            return Some(HeadOutcome::Refuse(ApiError::new(
                431,
                "Unknown",
                format!(
                    "Request Header Fields Too Large: more than {} header fields",
                    limits.max_headers
                ),
            )))
        }
        Err(e) => return Some(HeadOutcome::Refuse(malformed(e))),
    };
    Some(match accept(&head, limits) {
        Ok(outcome) => outcome,
        Err(e) => HeadOutcome::Refuse(e),
    })
}

fn accept(head: &ParsedHead, limits: &HeadLimits) -> Result<HeadOutcome, ApiError> {
    if head.len > limits.max_header_bytes {
        return Err(header_too_large(limits));
    }
    if head.path.len() > limits.max_uri_bytes {
        return Err(ApiError::new(
            414,
            "Unknown",
            format!(
                "URI Too Long: the request URI is longer than {} bytes",
                limits.max_uri_bytes
            ),
        ));
    }
    http::Method::from_bytes(&head.method)
        .map_err(|_| ApiError::bad_request("malformed HTTP request: invalid method"))?;
    http::Uri::try_from(head.path.as_slice())
        .map_err(|e| ApiError::bad_request(format!("malformed HTTP request: {e}")))?;
    // The body's framing, by hyper's rules (RFC 9112 section 6): a Transfer-Encoding whose
    // last coding is chunked wins over any Content-Length; one that is not, or one on
    // HTTP/1.0, is refused; Content-Lengths must be digits and agree.
    let mut chunked = None;
    let mut length: Option<u64> = None;
    let mut upgrade = head.method == b"CONNECT";
    for (which, value) in &head.framing_headers {
        match which {
            FramingHeader::TransferEncoding => {
                if !head.http11 {
                    return Err(ApiError::bad_request(
                        "malformed HTTP request: Transfer-Encoding on HTTP/1.0",
                    ));
                }
                chunked = Some(last_coding_is_chunked(value));
            }
            FramingHeader::ContentLength => {
                let n = content_length(value).ok_or_else(|| {
                    ApiError::bad_request("malformed HTTP request: invalid Content-Length")
                })?;
                if length.is_some_and(|m| m != n) {
                    return Err(ApiError::bad_request(
                        "malformed HTTP request: conflicting Content-Length headers",
                    ));
                }
                length = Some(n);
            }
            FramingHeader::Upgrade => upgrade |= head.http11,
        }
    }
    let framing = match (chunked, length) {
        (Some(false), _) => {
            return Err(ApiError::bad_request(
                "malformed HTTP request: unsupported Transfer-Encoding",
            ))
        }
        (Some(true), _) => Some(Framing::Chunked(ChunkTracker::default())),
        (None, Some(n)) if n > 0 => Some(Framing::Length(n)),
        (None, _) => None,
    };
    Ok(HeadOutcome::Accept {
        len: head.len,
        framing,
        upgrade,
    })
}

fn last_coding_is_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
}

fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

fn header_too_large(limits: &HeadLimits) -> ApiError {
    ApiError::new(
        431,
        "Unknown",
        format!(
            "Request Header Fields Too Large: the request line and headers exceed {} bytes",
            limits.max_header_bytes
        ),
    )
}

fn malformed(e: httparse::Error) -> ApiError {
    ApiError::bad_request(format!("malformed HTTP request: {e}"))
}

/// How a request body is delimited.
#[derive(Debug)]
enum Framing {
    /// This many bytes remain.
    Length(u64),
    Chunked(ChunkTracker),
}

impl Framing {
    /// How many bytes at the start of `data` belong to the body, and whether the body ends
    /// with them; `Err` for a chunked encoding the guard cannot follow.
    fn advance(&mut self, data: &[u8]) -> Result<(usize, bool), ()> {
        match self {
            Framing::Length(remaining) => {
                let n = usize::try_from(*remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                *remaining -= n as u64;
                Ok((n, *remaining == 0))
            }
            Framing::Chunked(tracker) => {
                let n = tracker.advance(data)?;
                Ok((n, tracker.state == Chunk::Done))
            }
        }
    }
}

/// Where a chunked body is, byte by byte, by the grammar hyper's decoder accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Chunk {
    /// The first hex digit of a chunk size.
    #[default]
    Start,
    Size,
    /// Blanks after the size.
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// After the last chunk: a trailer line or the final CRLF.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// Follows a chunked body to find where it ends.
#[derive(Debug, Default)]
struct ChunkTracker {
    state: Chunk,
    /// The chunk size being read, then the bytes of the chunk still to come.
    size: u64,
}

impl ChunkTracker {
    /// Consumes the body's bytes at the start of `data`: how many (all of them unless the body
    /// ends inside `data`).
    fn advance(&mut self, data: &[u8]) -> Result<usize, ()> {
        let mut i = 0;
        while i < data.len() && self.state != Chunk::Done {
            if self.state == Chunk::Data {
                let n = usize::try_from(self.size)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - i);
                i += n;
                self.size -= n as u64;
                if self.size == 0 {
                    self.state = Chunk::DataCr;
                }
                continue;
            }
            let b = data[i];
            i += 1;
            let digit = (b as char).to_digit(16).map(u64::from);
            self.state = match (self.state, b, digit) {
                (Chunk::Start | Chunk::Size, _, Some(d)) => {
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(d))
                        .ok_or(())?;
                    Chunk::Size
                }
                (Chunk::Size | Chunk::SizeLws, b' ' | b'\t', _) => Chunk::SizeLws,
                (Chunk::Size | Chunk::SizeLws, b';', _) => Chunk::Extension,
                (Chunk::Size | Chunk::SizeLws | Chunk::Extension, b'\r', _) => Chunk::SizeLf,
                (Chunk::Extension, b'\n', _) => return Err(()),
                (Chunk::Extension, _, _) => Chunk::Extension,
                (Chunk::SizeLf, b'\n', _) if self.size == 0 => Chunk::EndCr,
                (Chunk::SizeLf, b'\n', _) => Chunk::Data,
                (Chunk::DataCr, b'\r', _) => Chunk::DataLf,
                (Chunk::DataLf, b'\n', _) => Chunk::Start,
                (Chunk::EndCr, b'\r', _) => Chunk::EndLf,
                (Chunk::EndCr | Chunk::Trailer, _, _) if b != b'\r' => Chunk::Trailer,
                (Chunk::Trailer, b'\r', _) => Chunk::TrailerLf,
                (Chunk::TrailerLf, b'\n', _) => Chunk::EndCr,
                (Chunk::EndLf, b'\n', _) => Chunk::Done,
                _ => return Err(()),
            };
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HeadLimits {
        HeadLimits {
            max_header_bytes: 1024,
            max_headers: 4,
            max_uri_bytes: 64,
        }
    }

    fn accepted(head: &[u8]) -> (usize, Option<Framing>, bool) {
        match check_head(head, &limits()) {
            Some(HeadOutcome::Accept {
                len,
                framing,
                upgrade,
            }) => (len, framing, upgrade),
            other => panic!("{other:?}"),
        }
    }

    fn refused(head: &[u8]) -> ApiError {
        match check_head(head, &limits()) {
            Some(HeadOutcome::Refuse(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn head_ends_at_the_first_empty_line() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\na: b\r\n\r\nbody"),
            Some(24)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\na: b\n\nbody"), Some(21));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\na: b\r\n"), None);
    }

    #[test]
    fn framing_follows_hypers_rules() {
        let head = b"POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\nhello";
        let (len, framing, upgrade) = accepted(head);
        assert_eq!(len, head.len() - 5);
        assert!(matches!(framing, Some(Framing::Length(5))));
        assert!(!upgrade);
        // Transfer-Encoding wins over Content-Length, in either order.
        for head in [
            &b"POST / HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: gzip, chunked\r\n\r\n"[..],
            &b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"[..],
        ] {
            assert!(matches!(accepted(head).1, Some(Framing::Chunked(_))));
        }
        assert!(accepted(b"GET / HTTP/1.1\r\ncontent-length: 0\r\n\r\n")
            .1
            .is_none());
        assert!(accepted(b"GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n").2);
        assert!(!accepted(b"GET / HTTP/1.0\r\nupgrade: websocket\r\n\r\n").2);
    }

    #[test]
    fn bad_framing_is_a_bad_request() {
        for head in [
            &b"POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n"[..],
            &b"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n"[..],
            &b"POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"[..],
            &b"POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n"[..],
            &b"POST / HTTP/1.1\r\ncontent-length: 99999999999999999999999\r\n\r\n"[..],
            &b"GET /\x7f HTTP/1.1\r\n\r\n"[..],
            &b"GET / HTTP/2.0\r\n\r\n"[..],
        ] {
            let e = refused(head);
            assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"), "{head:?}");
        }
    }

    #[test]
    fn limits_are_431_and_414() {
        let e = refused(b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\ne: 5\r\n\r\n");
        assert_eq!((e.code, e.reason.as_str()), (431, "Unknown"));
        let uri = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(64));
        assert_eq!(refused(uri.as_bytes()).code, 414);
        let uri = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(63));
        accepted(uri.as_bytes());
        let big = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "v".repeat(1024));
        assert_eq!(refused(big.as_bytes()).code, 431);
        // Unfinished but already too big.
        assert!(check_head(big.as_bytes().split_at(1030).0, &limits()).is_some());
        assert!(check_head(b"GET / HTTP/1.1\r\nx: 1\r\n", &limits()).is_none());
    }

    #[test]
    fn chunk_tracker_finds_the_end_of_a_chunked_body() {
        let body = b"5;name=value\r\nhello\r\nA \r\n0123456789\r\n0\r\ntrailer: x\r\n\r\nNEXT";
        let whole = body.len() - 4;
        // Fed whole, and fed a byte at a time.
        let mut t = ChunkTracker::default();
        assert_eq!(t.advance(body), Ok(whole));
        assert_eq!(t.state, Chunk::Done);
        let mut t = ChunkTracker::default();
        let mut used = 0;
        for b in body.chunks(1) {
            if t.state == Chunk::Done {
                break;
            }
            used += t.advance(b).unwrap();
        }
        assert_eq!(used, whole);
        let mut t = ChunkTracker::default();
        assert_eq!(t.advance(b"0\r\n\r\n"), Ok(5));
        assert_eq!(t.state, Chunk::Done);
    }

    #[test]
    fn chunk_tracker_rejects_what_hyper_rejects() {
        for bad in [
            &b"zz\r\n"[..],
            &b"\r\n"[..],
            &b"5 5\r\n"[..],
            &b"5;a\nb\r\n"[..],
            &b"2\r\nabX"[..],
            &b"ffffffffffffffffff\r\n"[..],
        ] {
            assert!(ChunkTracker::default().advance(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn body_errors_name_their_cause() {
        let e = body_error(
            &io::Error::other("Invalid chunk size line: Invalid Size"),
            10,
        );
        assert_eq!(e.code, 400);
        assert!(
            e.message.ends_with("Invalid chunk size line: Invalid Size"),
            "{}",
            e.message
        );
        assert_eq!(
            request_timeout().to_status()["details"],
            serde_json::json!({})
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413() {
        let body = Body::from(vec![0u8; 11]);
        let e = read_body(body, 10, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (413, "RequestEntityTooLarge"));
        assert_eq!(e.message, "Request entity too large: limit is 10");
        let ok = read_body(Body::from("0123456789"), 10, Duration::from_secs(5)).await;
        assert_eq!(ok.unwrap(), "0123456789");
    }
}
