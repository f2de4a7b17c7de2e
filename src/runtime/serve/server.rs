//! The endpoint's server on `std::net`: a listening thread that accepts connections and gives
//! each its own tracer thread, at most [`MAX_CONNECTIONS`] at once (more are answered 503 at
//! once), which reads one request within [`REQUEST_TIMEOUT`] and [`MAX_HEAD`] + [`MAX_BODY`]
//! bytes, hands it to the routes' [`Handler`], and closes the connection after the answer.
//!
//! A connection costs only its own thread: a slow or idle client, a slow reader of its answer
//! (each `send` within [`WRITE_TIMEOUT`]) or a request that takes minutes (a delta profile,
//! a trace window) delays no other, and the limit bounds the threads and the memory (a head,
//! a body and an answer each). Every thread is a tracer thread: nothing it allocates is
//! sampled.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::request::{self, Head, MAX_BODY, MAX_HEAD};
use super::response::{self, text};
use crate::runtime::config::HTTP_ANY_ADDRESS_VAR;
use crate::runtime::descriptor::{move_high, OwnFd};
use crate::runtime::state::say;
use crate::runtime::tracer_thread::TracerThread;

/// The most connections served at once, each on a thread of its own.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// How long a connection has to send its request (head and body).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one `send` of an answer may wait for the client to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the idle listener looks whether its session stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long stopping waits for the listening thread to end.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// What answers a request read whole from a connection.
pub(crate) type Handler = dyn Fn(&Connection<'_>) -> io::Result<()> + Send + Sync;

/// A request read whole, and the connection to answer it on.
pub(crate) struct Connection<'a> {
    pub(crate) head: Head,
    pub(crate) body: &'a [u8],
    /// Whether the client is on this machine (at a loopback address).
    pub(crate) from_loopback: bool,
    stream: &'a TcpStream,
    stopped: &'a Receiver<()>,
}

impl Connection<'_> {
    /// The connection, for the answer.
    pub(crate) fn stream(&self) -> &TcpStream {
        self.stream
    }

    /// Wait `over`: false if the endpoint stops meanwhile (its session ends).
    pub(crate) fn wait(&self, over: Duration) -> bool {
        matches!(self.stopped.recv_timeout(over), Err(RecvTimeoutError::Timeout))
    }
}

/// A running endpoint; stopped by [`Endpoint::stop`].
pub(crate) struct Endpoint {
    thread: TracerThread<()>,
    /// The listening socket, shared with the thread.
    listener: Arc<OwnFd>,
    /// Dropped to stop the threads.
    stop: Sender<()>,
}

/// Serve at `addr` with `handler` (only a loopback address unless `any_address`): the
/// endpoint, or why it did not start.
pub(crate) fn start(addr: SocketAddr, any_address: bool, handler: Arc<Handler>) -> Result<Endpoint, String> {
    if !addr.ip().is_loopback() && !any_address {
        return Err(format!(
            "{addr} is not a loopback address: profiles are served on one only unless {HTTP_ANY_ADDRESS_VAR} is 1 \
             (or TraceConfig::http_on_any_address); no profile endpoint"
        ));
    }
    let cannot = |e: io::Error| format!("cannot serve profiles on {addr}: {e}");
    let listener = TcpListener::bind(addr).map_err(cannot)?;
    let bound = listener.local_addr().map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    // A descriptor of the tracer's own, above the low numbers, checked before each accept: a
    // program that closes it and listens on a socket of its own at the number must not have
    // its connections answered with profiles (see `descriptor`).
    let listener = Arc::new(OwnFd::new(move_high(OwnedFd::from(listener).into())));
    let served = Arc::clone(&listener);
    let (stop, stopped) = crossbeam_channel::bounded(0);
    let thread = TracerThread::spawn(c"memtrace-http", move || listen(&served, &handler, &stopped))
        .map_err(|e| format!("cannot start the profile endpoint's thread: {e}"))?;
    // Whenever it starts, so that whoever runs the program knows where to point a client.
    say(&format!("memtrace: serving heap profiles at http://{bound}/debug/pprof/heap"));
    Ok(Endpoint { thread, listener, stop })
}

impl Endpoint {
    /// Stop serving: the listening thread ends (waited for [`STOP_WAIT`] at most: a later
    /// session may want the port), and the connections end after their answers, those that
    /// wait out a delta or a window at once.
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

/// A connection accepted on `listener`, and its peer, if the number still holds the tracer's
/// socket.
fn accept(listener: &OwnFd) -> Option<(TcpStream, SocketAddr)> {
    if !listener.is_ours() {
        return None;
    }
    // SAFETY: accepting on the tracer's listening socket, checked above; the new descriptor is
    // the stream's alone.
    let fd =
        unsafe { libc::accept4(listener.number(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
    // SAFETY: as above.
    let stream = (fd >= 0).then(|| unsafe { TcpStream::from_raw_fd(fd) })?;
    let peer = stream.peer_addr().ok()?;
    Some((stream, peer))
}

/// One of a limited number of places (a connection's, a trace window's), given back when
/// dropped.
pub(crate) struct Place(Arc<AtomicUsize>);

impl Place {
    /// A place among the `limit` that `taken` counts, if one is free.
    pub(crate) fn take(taken: &Arc<AtomicUsize>, limit: usize) -> Option<Place> {
        taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Place(Arc::clone(taken)))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accept connections until `stopped` is disconnected, or the listener's number no longer
/// holds it, each answered on a thread of its own.
fn listen(listener: &OwnFd, handler: &Arc<Handler>, stopped: &Receiver<()>) {
    let taken = Arc::new(AtomicUsize::new(0));
    let mut poll = libc::pollfd { fd: listener.number(), events: libc::POLLIN, revents: 0 };
    while matches!(stopped.try_recv(), Err(TryRecvError::Empty)) {
        if !listener.is_ours() {
            say("memtrace: the program closed the profile endpoint's socket, or opened one of its own on its \
                 number; no longer serving profiles");
            return;
        }
        // SAFETY: `poll` is one valid pollfd (an invalid descriptor gives POLLNVAL, not harm).
        if unsafe { libc::poll(&mut poll, 1, STOP_CHECK.as_millis() as libc::c_int) } <= 0 {
            continue;
        }
        let Some((stream, peer)) = accept(listener) else {
            // Out of descriptors, say: the connection waits in the backlog meanwhile, and the
            // listener, still readable, must not make this a busy loop.
            std::thread::sleep(STOP_CHECK);
            continue;
        };
        let Some(place) = Place::take(&taken, MAX_CONNECTIONS) else {
            refuse(&stream, "too many connections to the memtrace endpoint: try again");
            continue;
        };
        // Shared, so that a connection whose thread cannot start still gets its 503.
        let stream = Arc::new(stream);
        let (theirs, handler, stopped) = (Arc::clone(&stream), Arc::clone(handler), stopped.clone());
        let from_loopback = peer.ip().is_loopback();
        let started = TracerThread::spawn(c"memtrace-http-c", move || {
            let _place = place;
            // Whatever the client does, the cost is this connection's.
            let _ = answer(&theirs, from_loopback, &*handler, &stopped);
        });
        if started.is_err() {
            refuse(&stream, "the memtrace endpoint cannot start a thread: try again");
        }
    }
}

/// Answer 503 on `stream` without waiting for the client: what it sent is read, up to a
/// request head's length (a close with unread bytes resets the connection, and the client may
/// lose the answer), the answer sent if it fits, and the connection closed.
fn refuse(stream: &TcpStream, why: &str) {
    let drain = || {
        let mut buf = [0u8; 1024];
        for _ in 0..MAX_HEAD / buf.len() {
            if !(&*stream).read(&mut buf).is_ok_and(|n| n > 0) {
                break;
            }
        }
    };
    if stream.set_nonblocking(true).is_ok() {
        drain();
        let _ = response::send(stream, &text(503, why));
        let _ = stream.shutdown(Shutdown::Write);
        drain();
    }
}

/// Read one request from `stream` and have `handler` answer it.
fn answer(stream: &TcpStream, from_loopback: bool, handler: &Handler, stopped: &Receiver<()>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut bytes = Vec::with_capacity(1024);
    let head_read = read_until(stream, &mut bytes, deadline, MAX_HEAD, |b| request::head_end(b).is_some())?;
    let Some(end) = request::head_end(&bytes).filter(|_| head_read) else {
        return send_and_close(stream, 400, "request head too long, too slow or malformed");
    };
    let Some(head) = request::parse_head(&bytes[..end]) else {
        return send_and_close(stream, 400, "malformed request head");
    };
    if head.content_length > MAX_BODY {
        return send_and_close(stream, 413, "request body too long");
    }
    let whole = end + head.content_length;
    if !read_until(stream, &mut bytes, deadline, whole, |b| b.len() >= whole)? {
        return send_and_close(stream, 400, "request body too slow or cut short");
    }
    handler(&Connection { head, body: &bytes[end..whole], from_loopback, stream, stopped })?;
    stream.shutdown(Shutdown::Write)
}

fn send_and_close(stream: &TcpStream, status: u16, message: &str) -> io::Result<()> {
    response::send(stream, &text(status, message))?;
    stream.shutdown(Shutdown::Write)
}

/// Read from `stream` into `bytes` until `done(bytes)`: false past `limit` bytes or
/// `deadline`, or when the connection ends first.
fn read_until(
    stream: &TcpStream,
    bytes: &mut Vec<u8>,
    deadline: Instant,
    limit: usize,
    done: impl Fn(&[u8]) -> bool,
) -> io::Result<bool> {
    let mut buf = [0u8; 1024];
    while !done(bytes) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || bytes.len() > limit {
            return Ok(false);
        }
        stream.set_read_timeout(Some(left))?;
        match (&*stream).read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
