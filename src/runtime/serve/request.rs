//! A request as the endpoint reads it: the head (request line and the few headers that matter
//! here) parsed from bytes, and the parameters of a query or a form body. No I/O: the server
//! reads the bytes, with its limits and deadlines.

/// The longest request head (request line and headers) read.
pub(crate) const MAX_HEAD: usize = 8 << 10;
/// The longest request body read (a form such as `rate=1e-4`).
pub(crate) const MAX_BODY: usize = 1 << 10;

/// A request's head: what the routes look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) method: String,
    /// The path, without the query.
    pub(crate) path: String,
    /// The query, without its `?` (empty when there is none).
    pub(crate) query: String,
    /// The body's length (`Content-Length`), 0 without one.
    pub(crate) content_length: usize,
    /// Whether it carries an `Origin` header: a browser's request, which a page of any site
    /// can make to a loopback address (a cross-site or DNS-rebinding attack).
    pub(crate) from_browser: bool,
}

/// The end of the head in `bytes` read so far: the offset just past its blank line.
pub(crate) fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|at| at + 4)
}

/// The head in `head` (up to its blank line): `None` when it is malformed (a bad request
/// line, a `Content-Length` that is not a number, several of them, or chunked bodies, which
/// nothing here takes).
pub(crate) fn parse_head(head: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let (method, target) = parse_request_line(lines.next()?)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut parsed =
        Head { method: method.into(), path: path.into(), query: query.into(), content_length: 0, from_browser: false };
    let mut lengths = 0;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            parsed.content_length = value.parse().ok()?;
            lengths += 1;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        } else if name.eq_ignore_ascii_case("origin") {
            parsed.from_browser = true;
        }
    }
    (lengths <= 1).then_some(parsed)
}

/// The method and target of a request line (`GET /debug/pprof/heap HTTP/1.1`).
fn parse_request_line(line: &str) -> Option<(&str, &str)> {
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let well_formed = parts.next().is_none()
        && !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && target.starts_with('/')
        && version.starts_with("HTTP/1.");
    well_formed.then_some((method, target))
}

/// The `name=value` pairs of a query or of a form body (`rate=1e-4&seconds=60`), as they are:
/// nothing the routes take needs percent-decoding.
pub(crate) fn params(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query.split('&').filter_map(|pair| pair.split_once('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let head = parse_head(b"GET /debug/pprof/heap?seconds=5 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((&head.method[..], &head.path[..], &head.query[..]), ("GET", "/debug/pprof/heap", "seconds=5"));
        assert_eq!((head.content_length, head.from_browser), (0, false));
        let post = parse_head(b"POST /x HTTP/1.0\r\ncontent-length: 9\r\nOrigin: http://evil\r\n\r\n").unwrap();
        assert_eq!((&post.method[..], post.content_length, post.from_browser), ("POST", 9, true));
        for bad in [
            &b"GET /x"[..],
            b"GET x HTTP/1.1",
            b"GET /x HTTP/2 extra",
            b"\xff\xfe",
            b"",
            b"GET /x SMTP",
            b"get /x HTTP/1.1",
            b"POST /x HTTP/1.1\r\nContent-Length: -1",
            b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked",
            b"GET /x HTTP/1.1\r\nno colon",
        ] {
            assert_eq!(parse_head(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn head_ends_and_params() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(
            params("seconds=5&rate=1e-4&junk&=x").collect::<Vec<_>>(),
            [("seconds", "5"), ("rate", "1e-4"), ("", "x")]
        );
    }
}
