//! The HTTP/1.1 subset the API speaks: one request per connection, `Content-Length` bodies,
//! bounded sizes. Used by the server to read requests and by the client to read responses.
//!
//! Untrusted bytes are handled with explicit limits: the head (request line and headers) may not
//! exceed [`MAX_HEAD_BYTES`], a body may not exceed the caller's limit, and anything that does not
//! parse is a [`HttpError`] that maps to a 4xx status.

use std::io::{self, Read, Write};

use thiserror::Error;

/// Largest request or response head (start line plus headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Default limit of a request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Why a message could not be read.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The peer closed or the socket failed (including read timeouts).
    #[error("Connection failed")]
    Io(#[from] io::Error),
    /// Not HTTP/1.x as we speak it.
    #[error("Malformed HTTP: {0}")]
    Malformed(String),
    /// The head or body is larger than allowed.
    #[error("{what} larger than {limit} bytes")]
    TooLarge {
        /// "Request head", "Request body", ...
        what: &'static str,
        /// The limit in bytes.
        limit: usize,
    },
    /// A feature of HTTP we do not implement (chunked bodies).
    #[error("Not supported: {0}")]
    Unsupported(String),
}

impl HttpError {
    /// The status to answer with, `None` when the connection is unusable.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Io(_) => None,
            HttpError::Malformed(_) => Some(400),
            HttpError::TooLarge { .. } => Some(413),
            HttpError::Unsupported(_) => Some(501),
        }
    }

    /// True when the read timed out (a socket timeout or the request's deadline).
    pub fn is_timeout(&self) -> bool {
        matches!(self, HttpError::Io(e)
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (empty without `Content-Length`).
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra headers (besides Content-Type, Content-Length, Connection).
    pub headers: Vec<(String, String)>,
    /// Content type of the body.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, value: &impl serde::Serialize) -> Response {
        let mut body = serde_json::to_vec_pretty(value).unwrap_or_else(|_| b"{}".to_vec());
        body.push(b'\n');
        Response {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body,
        }
    }

    /// A JSON `{"error": message}` response.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(
            status,
            &crate::wire::ErrorBody {
                error: message.into(),
            },
        )
    }

    /// A plain-text response.
    pub fn text(status: u16, content_type: &'static str, body: String) -> Response {
        Response {
            status,
            headers: Vec::new(),
            content_type,
            body: body.into_bytes(),
        }
    }

    /// Adds a header (builder style).
    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Writes the response; the connection is closed after it.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        w.write_all(head.as_bytes())?;
        w.write_all(&self.body)?;
        w.flush()
    }
}

/// The reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// The bytes of a message head as they arrive. The end of the head (`\r\n\r\n`) is searched
/// only in the bytes that are new since the last push (and the 3 before them), so a client
/// sending one byte at a time costs linear, not quadratic, work.
#[derive(Debug, Default)]
pub struct HeadBuffer {
    /// Bytes received so far.
    buf: Vec<u8>,
    /// Bytes already searched for the end of the head (none of them ends it).
    scanned: usize,
    /// Bytes compared in all searches so far (for tests of the scanning cost).
    examined: u64,
}

impl HeadBuffer {
    /// An empty head.
    pub fn new() -> HeadBuffer {
        HeadBuffer::default()
    }

    /// True before the first byte.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes compared in all searches so far: at most about 4 per byte pushed.
    pub fn bytes_examined(&self) -> u64 {
        self.examined
    }

    /// Adds `bytes`; returns the head (without its final blank line) and the bytes past it once
    /// the head is complete. A head longer than [`MAX_HEAD_BYTES`] is an error.
    pub fn push(
        &mut self,
        bytes: &[u8],
        what: &'static str,
    ) -> Result<Option<(String, Vec<u8>)>, HttpError> {
        self.buf.extend_from_slice(bytes);
        let from = self.scanned.saturating_sub(3);
        self.examined += (self.buf.len() - from) as u64;
        if let Some(at) = find(&self.buf[from..], b"\r\n\r\n") {
            let end = from + at;
            let mut buf = std::mem::take(&mut self.buf);
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            let head = String::from_utf8(buf)
                .map_err(|_| HttpError::Malformed("head is not UTF-8".into()))?;
            return Ok(Some((head, rest)));
        }
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_HEAD_BYTES {
            return Err(HttpError::TooLarge {
                what,
                limit: MAX_HEAD_BYTES,
            });
        }
        Ok(None)
    }
}

/// Reads up to the end of the head (`\r\n\r\n`); returns the head and any body bytes read
/// past it.
fn read_head(r: &mut impl Read, what: &'static str) -> Result<(String, Vec<u8>), HttpError> {
    let mut head = HeadBuffer::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(n) => n,
            // A signal (SIGHUP asking for a reload, SIGCHLD) landed on this thread: read again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(if head.is_empty() {
                HttpError::Io(io::ErrorKind::UnexpectedEof.into())
            } else {
                HttpError::Malformed("connection closed inside the head".into())
            });
        }
        if let Some(done) = head.push(&chunk[..n], what)? {
            return Ok(done);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_headers<'a>(
    lines: impl Iterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, HttpError> {
    let mut headers = Vec::new();
    for line in lines {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| HttpError::Malformed(format!("header line without ':': {line:?}")))?;
        if k.is_empty() || k.contains(|c: char| c.is_whitespace()) {
            return Err(HttpError::Malformed(format!("bad header name {k:?}")));
        }
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    Ok(headers)
}

/// Reads exactly the body announced by the headers.
fn read_body(
    r: &mut impl Read,
    headers: &[(String, String)],
    mut already: Vec<u8>,
    limit: usize,
    what: &'static str,
) -> Result<Vec<u8>, HttpError> {
    if headers.iter().any(|(k, _)| k == "transfer-encoding") {
        return Err(HttpError::Unsupported(
            "Transfer-Encoding (send Content-Length)".into(),
        ));
    }
    let mut lengths = headers.iter().filter(|(k, _)| k == "content-length");
    let len = match (lengths.next(), lengths.next()) {
        (None, _) => 0,
        (Some(_), Some(_)) => {
            return Err(HttpError::Malformed("two Content-Length headers".into()))
        }
        (Some((_, v)), None) => v
            .parse::<usize>()
            .map_err(|_| HttpError::Malformed(format!("bad Content-Length {v:?}")))?,
    };
    if len > limit {
        return Err(HttpError::TooLarge { what, limit });
    }
    if already.len() > len {
        return Err(HttpError::Malformed(
            "more bytes than Content-Length".into(),
        ));
    }
    let have = already.len();
    already.resize(len, 0);
    r.read_exact(&mut already[have..]).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            HttpError::Malformed("body shorter than Content-Length".into())
        } else {
            HttpError::Io(e)
        }
    })?;
    Ok(already)
}

/// The start line and headers of a request, read before its body so the server can refuse a
/// request (wrong token, body too large) without reading the body first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body bytes that arrived with the head.
    rest: Vec<u8>,
}

impl RequestHead {
    /// The first header called `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Reads the body announced by the head (at most `max_body_bytes`) and completes the request.
    pub fn read_body(self, r: &mut impl Read, max_body_bytes: usize) -> Result<Request, HttpError> {
        let body = read_body(r, &self.headers, self.rest, max_body_bytes, "Request body")?;
        Ok(Request {
            method: self.method,
            path: self.path,
            headers: self.headers,
            body,
        })
    }
}

/// Reads the start line and the headers of a request.
pub fn read_request_head(r: &mut impl Read) -> Result<RequestHead, HttpError> {
    let (head, rest) = read_head(r, "Request head")?;
    parse_request_head(&head, rest)
}

/// Parses a complete request head (as [`HeadBuffer::push`] returns it) and the body bytes that
/// arrived with it.
pub fn parse_request_head(head: &str, rest: Vec<u8>) -> Result<RequestHead, HttpError> {
    let mut lines = head.split("\r\n");
    let start = lines.next().unwrap_or("");
    let mut parts = start.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if !m.is_empty() && t.starts_with('/') => (m, t, v),
        _ => return Err(HttpError::Malformed(format!("bad request line {start:?}"))),
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::Malformed(format!(
            "unsupported version {version:?}"
        )));
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HttpError::Malformed(format!("bad method {method:?}")));
    }
    let headers = parse_headers(lines)?;
    let path = target.split('?').next().unwrap_or(target).to_string();
    Ok(RequestHead {
        method: method.to_string(),
        path,
        headers,
        rest,
    })
}

/// Reads one request with a body of at most `max_body_bytes`.
pub fn read_request(r: &mut impl Read, max_body_bytes: usize) -> Result<Request, HttpError> {
    read_request_head(r)?.read_body(r, max_body_bytes)
}

/// A response as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Reads one response (the server always sends `Content-Length`); bodies up to `max_body_bytes`.
pub fn read_response(
    r: &mut impl Read,
    max_body_bytes: usize,
) -> Result<ClientResponse, HttpError> {
    let (head, rest) = read_head(r, "Response head")?;
    let mut lines = head.split("\r\n");
    let start = lines.next().unwrap_or("");
    let status = start
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| start.strip_prefix("HTTP/1.0 "))
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| HttpError::Malformed(format!("bad status line {start:?}")))?;
    let headers = parse_headers(lines)?;
    let body = read_body(r, &headers, rest, max_body_bytes, "Response body")?;
    Ok(ClientResponse {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bytes: &[u8]) -> Result<Request, HttpError> {
        read_request(&mut &bytes[..], 16)
    }

    #[test]
    fn parses_a_request_with_body_in_pieces() {
        // A reader that returns one byte at a time exercises the head/body split.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let raw = b"PUT /v1/policies/vm1?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let r = read_request(&mut Trickle(raw), 16).unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("PUT", "/v1/policies/vm1")
        );
        assert_eq!(r.header("content-length"), Some("5"));
        assert_eq!(r.body, b"hello");
        let r = req(b"GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").unwrap();
        assert_eq!(r.body, b"abc");
    }

    #[test]
    fn a_read_interrupted_by_a_signal_is_retried() {
        // Every other read fails with EINTR, as when SIGHUP lands on the reading thread.
        struct Interrupting<'a>(&'a [u8], bool);
        impl Read for Interrupting<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                let n = buf.len().min(self.0.len()).min(7);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let r = read_response(&mut Interrupting(raw, false), 16).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let raw = b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n";
        let r = read_request(&mut Interrupting(raw, false), 16).unwrap();
        assert_eq!(r.path, "/v1/stats");
    }

    #[test]
    fn refuses_what_it_does_not_speak() {
        let status = |b: &[u8]| req(b).unwrap_err().status();
        assert_eq!(status(b"GET /\r\n\r\n"), Some(400));
        assert_eq!(status(b"get / HTTP/1.1\r\n\r\n"), Some(400));
        assert_eq!(status(b"GET / HTTP/2\r\n\r\n"), Some(400));
        assert_eq!(status(b"GET / HTTP/1.1\r\nNoColon\r\n\r\n"), Some(400));
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 99\r\n\r\n"),
            Some(413)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            Some(400)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc"),
            Some(400)
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Some(501)
        );
        let huge = vec![b'a'; MAX_HEAD_BYTES + 10];
        assert_eq!(status(&huge), Some(413));
        assert_eq!(status(b""), None);
    }

    #[test]
    fn a_head_sent_byte_by_byte_is_scanned_in_linear_time() {
        let mut raw = b"GET /v1/health HTTP/1.1\r\n".to_vec();
        while raw.len() < MAX_HEAD_BYTES - 100 {
            raw.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        raw.extend_from_slice(b"\r\n");
        let mut h = HeadBuffer::new();
        let mut done = None;
        for b in &raw {
            if let Some(d) = h.push(&[*b], "Request head").unwrap() {
                done = Some(d);
            }
        }
        let (head, rest) = done.unwrap();
        assert!(rest.is_empty());
        assert_eq!(head.len(), raw.len() - 4);
        // Re-scanning the whole buffer per byte would compare ~n²/2 = 130 M bytes.
        assert!(
            h.bytes_examined() <= 4 * raw.len() as u64,
            "{} bytes examined for a {}-byte head",
            h.bytes_examined(),
            raw.len()
        );
        // The end of the head split across pushes is found.
        let mut h = HeadBuffer::new();
        assert!(h.push(b"GET / HTTP/1.1\r\n\r", "h").unwrap().is_none());
        let (head, rest) = h.push(b"\nbody", "h").unwrap().unwrap();
        assert_eq!(
            (head.as_str(), rest.as_slice()),
            ("GET / HTTP/1.1", &b"body"[..])
        );
    }

    #[test]
    fn response_round_trip() {
        let mut out = Vec::new();
        Response::error(422, "Vif 'a': weight must be greater than 0")
            .with_header("X-Test", "1")
            .write_to(&mut out)
            .unwrap();
        let r = read_response(&mut &out[..], 1024).unwrap();
        assert_eq!(r.status, 422);
        assert!(r.headers.contains(&("x-test".into(), "1".into())));
        let body: crate::wire::ErrorBody = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body.error, "Vif 'a': weight must be greater than 0");
    }
}
