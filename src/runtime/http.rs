//! The built-in HTTP endpoint (`MEMTRACE_HTTP`, [`TraceConfig::http`](crate::TraceConfig::http)):
//! a small HTTP/1.1 responder on `std::net` that answers `GET`s of `/debug/pprof/…` with
//! `profile::respond`, on a tracer thread of its own (nothing it allocates is sampled).
//!
//! One connection at a time, each bounded: the request's head must come within
//! [`HEAD_TIMEOUT`] and [`MAX_HEAD`] bytes, the answer is written within [`WRITE_TIMEOUT`], and
//! the connection is closed after it. A malformed, slow or huge request gets at most a short
//! error and a closed connection; connections wait in the kernel's backlog meanwhile. Only a
//! loopback address is served unless the configuration opts in to others.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::descriptor::{move_high, OwnFd};
use super::live_profile::Mailbox;
use super::profile::{self, HttpResponse};
use super::tracer_thread::TracerThread;

/// The longest request head (request line and headers) read.
const MAX_HEAD: usize = 8 << 10;
/// How long a connection has to send its request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// How long writing an answer may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the idle endpoint looks whether its session stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long stopping waits for the endpoint's thread to end (it may be writing an answer).
const STOP_WAIT: Duration = Duration::from_secs(1);

/// A running endpoint; stopped by [`Endpoint::stop`].
pub(crate) struct Endpoint {
    thread: TracerThread<()>,
    /// The listening socket, shared with the thread.
    listener: Arc<OwnFd>,
    /// Dropped to stop the thread.
    stop: Sender<()>,
}

/// Why the endpoint did not start.
pub(crate) fn start(addr: SocketAddr, any_address: bool, mailbox: Mailbox) -> Result<Endpoint, String> {
    if !addr.ip().is_loopback() && !any_address {
        return Err(format!(
            "{addr} is not a loopback address: profiles are served on one only unless {} is 1 (or \
             TraceConfig::http_on_any_address); no profile endpoint",
            super::config::HTTP_ANY_ADDRESS_VAR
        ));
    }
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot serve profiles on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("cannot serve profiles on {addr}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| format!("cannot serve profiles on {addr}: {e}"))?;
    // A descriptor of the tracer's own, above the low numbers, checked before each accept: a
    // program that closes it and listens on a socket of its own at the number must not have
    // its connections answered with profiles (see `descriptor`).
    let listener = Arc::new(OwnFd::new(move_high(OwnedFd::from(listener).into())));
    let served = Arc::clone(&listener);
    let (stop, stopped) = crossbeam_channel::bounded(0);
    let thread = TracerThread::spawn(c"memtrace-http", move || serve(&served, &mailbox, &stopped))
        .map_err(|e| format!("cannot start the profile endpoint's thread: {e}"))?;
    if addr.port() == 0 {
        super::state::say(&format!("memtrace: serving heap profiles at http://{bound}/debug/pprof/heap"));
    }
    Ok(Endpoint { thread, listener, stop })
}

impl Endpoint {
    /// Stop serving: the thread ends after the request it is answering, if any; waited for
    /// [`STOP_WAIT`] at most (a later session may want the port), then left to end alone.
    pub(crate) fn stop(self) {
        drop(self.stop);
        let deadline = Instant::now() + STOP_WAIT;
        while !self.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.thread.is_finished() {
            let _ = self.thread.join();
        }
    }

    /// Leave the thread alone: in a forked child, which does not have it.
    pub(crate) fn forget(self) {
        self.thread.forget();
    }

    /// In a forked child (once, right after the fork), close the copy of the listening socket:
    /// no thread here answers it, and it would keep the port taken, its connections waiting,
    /// after the parent stops serving.
    pub(crate) fn close_in_forked_child(&self) {
        if self.listener.is_ours() {
            // SAFETY: the child's copy of the descriptor, checked above, which nothing in the
            // child uses (the thread that serves it is the parent's), closed once.
            unsafe { libc::close(self.listener.number()) };
        }
    }
}

/// Accept and answer connections one at a time until `stopped` is disconnected, or the
/// listener's number no longer holds it.
fn serve(listener: &OwnFd, mailbox: &Mailbox, stopped: &Receiver<()>) {
    let mut poll = libc::pollfd { fd: listener.number(), events: libc::POLLIN, revents: 0 };
    while matches!(stopped.try_recv(), Err(TryRecvError::Empty)) {
        if !listener.is_ours() {
            super::state::say(
                "memtrace: the program closed the profile endpoint's socket, or opened one of its own on its \
                 number; no longer serving profiles",
            );
            return;
        }
        // SAFETY: `poll` is one valid pollfd (an invalid descriptor gives POLLNVAL, not harm).
        if unsafe { libc::poll(&mut poll, 1, STOP_CHECK.as_millis() as libc::c_int) } <= 0 {
            continue;
        }
        let Some(stream) = accept(listener) else {
            // Out of descriptors, say: the connection waits in the backlog meanwhile, and the
            // listener, still readable, must not make this a busy loop.
            std::thread::sleep(STOP_CHECK);
            continue;
        };
        // Whatever the client does, the cost is this connection's.
        let _ = answer(stream, mailbox, stopped);
    }
}

/// A connection accepted on `listener`, if it still holds the tracer's socket.
fn accept(listener: &OwnFd) -> Option<TcpStream> {
    if !listener.is_ours() {
        return None;
    }
    // SAFETY: accepting on the tracer's listening socket, checked above; the new descriptor is
    // the stream's alone.
    let fd =
        unsafe { libc::accept4(listener.number(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
    // SAFETY: as above.
    (fd >= 0).then(|| unsafe { TcpStream::from_raw_fd(fd) })
}

/// Read one request from `stream` and answer it.
fn answer(mut stream: TcpStream, mailbox: &Mailbox, stopped: &Receiver<()>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let Some(head) = read_head(&mut stream)? else {
        return write_response(&stream, &profile::text(400, "request head too long, too slow or malformed"));
    };
    let response = match parse_request_line(&head) {
        Some(("GET", target)) => profile::respond(mailbox, target, |over| {
            // Interrupted when the session stops.
            matches!(stopped.recv_timeout(over), Err(RecvTimeoutError::Timeout))
        }),
        Some(_) => profile::text(405, "only GET is served"),
        None => profile::text(400, "malformed request line"),
    };
    write_response(&stream, &response)
}

/// The request's head (up to the blank line), `None` past [`MAX_HEAD`] bytes or
/// [`HEAD_TIMEOUT`], or when the connection ends first.
fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // The blank line may straddle two reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(from + end);
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// The method and target of `head`'s request line (`GET /debug/pprof/heap HTTP/1.1`).
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = std::str::from_utf8(head.split(|&b| b == b'\r').next()?).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && target.starts_with('/') && version.starts_with("HTTP/1.")).then_some((method, target))
}

fn write_response(stream: &TcpStream, response: &HttpResponse) -> std::io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    );
    send_all(stream, head.as_bytes())?;
    send_all(stream, &response.body)?;
    stream.shutdown(Shutdown::Write)
}

/// Write `bytes` to `stream` with `MSG_NOSIGNAL`: a client that closed its end must not raise
/// `SIGPIPE`, which kills a program that has not set it aside.
fn send_all(stream: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length; the descriptor is open.
        let sent = unsafe { libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
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
    fn request_lines() {
        assert_eq!(
            parse_request_line(b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x"),
            Some(("GET", "/debug/pprof/heap"))
        );
        assert_eq!(parse_request_line(b"POST /x HTTP/1.0"), Some(("POST", "/x")));
        for bad in [&b"GET /x"[..], b"GET x HTTP/1.1", b"GET /x HTTP/2 extra", b"\xff\xfe", b"", b"GET /x SMTP"] {
            assert_eq!(parse_request_line(bad), None, "{bad:?}");
        }
    }
}
