//! Answers: [`HttpResponse`], a whole answer (what the routes give and what a web framework's
//! handler returns), and the two ways one goes out on a connection: at once with its length,
//! or streamed in chunks ([`Chunked`], a trace window's, whose length is known at its end).
//! Every write is a `send` with `MSG_NOSIGNAL`.

use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use crate::inert::inert;

/// An answer to an HTTP request for a profile (see [`http_response`](crate::http_response)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpResponse {
    /// The status code: 200, 400 (a malformed query), 404 (no such profile), 503 (no
    /// session, or the writer busy).
    pub status: u16,
    /// The body's `Content-Type`.
    pub content_type: &'static str,
    /// The body: the profile, or a one-line explanation.
    pub body: Vec<u8>,
}

/// A plain-text answer of `status`: `message` on one line, made [`inert`]: a message may quote
/// a path or a writer's error, and a client shows it on a terminal.
pub(crate) fn text(status: u16, message: &str) -> HttpResponse {
    HttpResponse {
        status,
        content_type: "text/plain; charset=utf-8",
        body: format!("{}\n", inert(message)).into_bytes(),
    }
}

/// The head of an answer of `status` and `content_type`, with `length` (`None`: chunked).
fn head(status: u16, content_type: &str, length: Option<usize>) -> String {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        _ => "Service Unavailable",
    };
    let length = match length {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_owned(),
    };
    format!("HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{length}\r\nConnection: close\r\n\r\n")
}

/// Write `response` whole to `stream`.
pub(crate) fn send(stream: &TcpStream, response: &HttpResponse) -> io::Result<()> {
    send_all(stream, head(response.status, response.content_type, Some(response.body.len())).as_bytes())?;
    send_all(stream, &response.body)
}

/// A 200 answer of `content_type` streamed to a connection in chunks, its head sent with the
/// first bytes of its body: until then the route may still answer an error instead
/// ([`Chunked::started`]). Not [`finish`](Chunked::finish)ed, it lacks its last chunk, and a
/// client sees the body cut short (curl: "transfer closed with outstanding read data").
pub(crate) struct Chunked<'a> {
    stream: &'a TcpStream,
    content_type: &'static str,
    started: bool,
}

impl<'a> Chunked<'a> {
    pub(crate) fn new(stream: &'a TcpStream, content_type: &'static str) -> Chunked<'a> {
        Chunked { stream, content_type, started: false }
    }

    /// Whether any of the answer was sent.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Send the last chunk (and the head, for an empty body).
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.start()?;
        send_all(self.stream, b"0\r\n\r\n")
    }

    fn start(&mut self) -> io::Result<()> {
        if !self.started {
            self.started = true;
            send_all(self.stream, head(200, self.content_type, None).as_bytes())?;
        }
        Ok(())
    }
}

impl Write for Chunked<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        // An empty chunk would end the body.
        if bytes.is_empty() {
            return Ok(0);
        }
        self.start()?;
        send_all(self.stream, format!("{:x}\r\n", bytes.len()).as_bytes())?;
        send_all(self.stream, bytes)?;
        send_all(self.stream, b"\r\n")?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Write `bytes` to `stream` with `MSG_NOSIGNAL`: a client that closed its end must not raise
/// `SIGPIPE`, which kills a program that has not set it aside. The stream's write timeout
/// bounds each `send`.
pub(crate) fn send_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length; the descriptor is open.
        let sent = unsafe { libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_answers_are_inert() {
        let answer = text(409, "cannot open /tmp/a\x1b[2Jb\u{202e}c\nd: é");
        assert_eq!(String::from_utf8(answer.body).unwrap(), "cannot open /tmp/a\\x1b[2Jb\\u{202e}c\\x0ad: é\n");
    }
}
