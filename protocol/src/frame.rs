//! RESP frames: a two-pass decoder (cheap completeness check, then a
//! zero-copy parse) and an encoder for RESP2 and RESP3.
//!
//! # Format
//!
//! ```text
//! +simple\r\n          -ERR message\r\n        :42\r\n
//! $5\r\nhello\r\n      $-1\r\n (null)          *2\r\n<frame><frame>   *-1\r\n (null)
//! RESP3: _\r\n (null)  #t\r\n / #f\r\n        ,1.5\r\n            %1\r\n<key><value>
//! inline (requests only): CLAIM order-1 LEASE 5000\r\n
//! ```
//!
//! Every announced length is checked against [`Limits`] when its header is
//! read, before any of its payload is buffered, so a client announcing
//! `$2147483647` gets an error at once instead of making the reader wait for
//! (or allocate) two gigabytes.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::FrameError;

/// One RESP value.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `+text` — a status word such as `OK` or `ACQUIRED`.
    Simple(Bytes),
    /// `-CODE message` — an error reply.
    Error(Bytes),
    /// `:n` — a signed integer.
    Integer(i64),
    /// `$n` — a binary-safe string.
    Bulk(Bytes),
    /// `*n` — an array of frames.
    Array(Vec<Frame>),
    /// Null: `$-1` / `*-1` in RESP2, `_` in RESP3.
    Null,
    /// `%n` — a map (RESP3; a flat array of pairs in RESP2).
    Map(Vec<(Frame, Frame)>),
    /// `#t` / `#f` (RESP3; an integer 1 / 0 in RESP2).
    Boolean(bool),
    /// `,x` — a double (RESP3; a bulk string in RESP2).
    Double(f64),
}

impl Frame {
    /// The heap memory the frame holds beyond its own size: its strings'
    /// bytes and its arrays' and maps' element storage, recursively (a
    /// string shared with others is counted in full).
    pub fn heap_size(&self) -> usize {
        match self {
            Frame::Simple(b) | Frame::Error(b) | Frame::Bulk(b) => b.len(),
            Frame::Array(v) => {
                v.capacity() * std::mem::size_of::<Frame>()
                    + v.iter().map(Frame::heap_size).sum::<usize>()
            }
            Frame::Map(v) => {
                v.capacity() * std::mem::size_of::<(Frame, Frame)>()
                    + v.iter()
                        .map(|(k, x)| k.heap_size() + x.heap_size())
                        .sum::<usize>()
            }
            Frame::Integer(_) | Frame::Null | Frame::Boolean(_) | Frame::Double(_) => 0,
        }
    }

    /// A simple string from a static word.
    pub fn simple(s: &'static str) -> Frame {
        Frame::Simple(Bytes::from_static(s.as_bytes()))
    }

    /// A bulk string from anything that converts into `Bytes`.
    pub fn bulk(b: impl Into<Bytes>) -> Frame {
        Frame::Bulk(b.into())
    }

    /// An array of bulk strings, the shape of every request.
    pub fn command<I, B>(args: I) -> Frame
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        Frame::Array(args.into_iter().map(|a| Frame::Bulk(a.into())).collect())
    }
}

/// The protocol version a connection speaks (changed by `HELLO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// RESP2, the default.
    #[default]
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

/// Size limits enforced while decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string, in bytes.
    pub max_bulk: usize,
    /// Most elements in one array (or pairs in one map).
    pub max_array: usize,
    /// Longest inline command line (and simple-string line), in bytes.
    pub max_inline: usize,
    /// Deepest nesting of arrays and maps.
    pub max_depth: usize,
    /// Largest whole frame, in bytes, counting announced payloads.
    pub max_frame: usize,
    /// Whether a line not starting with a RESP type byte is an inline
    /// command (true for servers, false for clients reading replies).
    pub inline: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 1024 * 1024 + 1024,
            max_array: 1024,
            max_inline: 64 * 1024,
            max_depth: 8,
            max_frame: 4 * 1024 * 1024,
            inline: true,
        }
    }
}

impl Limits {
    /// Limits for a client reading replies: generous sizes, no inline.
    pub fn for_replies() -> Self {
        Limits {
            max_bulk: 512 * 1024 * 1024,
            max_array: 16 * 1024 * 1024,
            max_inline: 1024 * 1024,
            max_depth: 16,
            max_frame: usize::MAX,
            inline: false,
        }
    }
}

/// Longest numeric header line (`$`, `*`, `:` and friends) we accept.
const MAX_NUMBER_LINE: usize = 32;

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` when the buffer does not yet hold a whole frame (read
/// more and call again); on success the frame's bytes are split off `buf` and
/// every string in the frame is a zero-copy slice of them. A request with
/// nothing in it (see [`parse`]) is skipped and reported as `Ok(None)` once
/// nothing else is buffered.
pub fn decode(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    loop {
        let Some(len) = check(buf, limits)? else {
            return Ok(None);
        };
        let bytes = buf.split_to(len).freeze();
        if let Some(frame) = parse(&bytes, limits)? {
            return Ok(Some(frame));
        }
        // A request with nothing in it: nothing to answer; look at what
        // follows.
    }
}

/// A decoder that resumes: across calls on one buffer it does not look at
/// a pending frame again until it can have completed. Every frame, RESP or
/// inline, ends with a `\n`, so while the bytes that arrived since the last
/// look hold none (and the buffer is within the inline limit, which a line
/// without one could break), the frame is still incomplete and is not
/// checked again. A request trickled a byte at a time then costs work
/// linear in its length, not quadratic.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Bytes of the buffer already looked at for the pending frame (0: a
    /// new frame).
    seen: usize,
    /// Times a buffer was checked for a whole frame.
    checks: u64,
}

impl Decoder {
    /// A decoder with nothing pending.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// As [`decode`], resuming from what earlier calls saw of `buf` (pass
    /// the same buffer every time).
    pub fn decode(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Frame>, FrameError> {
        loop {
            let seen = self.seen;
            if seen > 0
                && seen <= buf.len()
                && buf.len() <= limits.max_inline
                && !buf[seen..].contains(&b'\n')
            {
                self.seen = buf.len();
                return Ok(None);
            }
            self.checks += 1;
            let Some(len) = check(buf, limits)? else {
                self.seen = buf.len();
                return Ok(None);
            };
            self.seen = 0;
            let bytes = buf.split_to(len).freeze();
            if let Some(frame) = parse(&bytes, limits)? {
                return Ok(Some(frame));
            }
        }
    }

    /// How many times a buffer was checked for a whole frame (for tests
    /// and benchmarks of the work done).
    pub fn checks(&self) -> u64 {
        self.checks
    }
}

/// Pass one: if `buf` starts with a complete frame, its length in bytes.
///
/// Cheap: it reads headers and skips payloads. Errors as soon as an
/// announced length is over a limit or a byte is out of place.
pub fn check(buf: &[u8], limits: &Limits) -> Result<Option<usize>, FrameError> {
    let mut budget = limits.max_frame;
    check_at(buf, 0, 0, limits, &mut budget)
}

fn check_at(
    buf: &[u8],
    pos: usize,
    depth: usize,
    limits: &Limits,
    budget: &mut usize,
) -> Result<Option<usize>, FrameError> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    match kind {
        b'+' | b'-' => {
            Ok(find_line(buf, pos + 1, limits.max_inline, "simple string")?.map(|(_, next)| next))
        }
        b':' => number_line(buf, pos + 1).map(|o| o.map(|(_, next)| next)),
        b'_' => match small_line(buf, pos + 1, 0)? {
            Some((b"", next)) => Ok(Some(next)),
            Some(_) => Err(FrameError::Protocol("invalid null")),
            None => Ok(None),
        },
        b'#' => match small_line(buf, pos + 1, 1)? {
            Some((line, next)) if line == b"t" || line == b"f" => Ok(Some(next)),
            Some(_) => Err(FrameError::Protocol("invalid boolean")),
            None => Ok(None),
        },
        b',' => Ok(small_line(buf, pos + 1, MAX_NUMBER_LINE * 4)?.map(|(_, next)| next)),
        b'$' => {
            let Some((len, next)) = number_line(buf, pos + 1)? else {
                return Ok(None);
            };
            if len == -1 {
                return Ok(Some(next));
            }
            let len = length(len, limits.max_bulk, "bulk length")?;
            spend(budget, len, limits.max_frame)?;
            let end = next + len + 2;
            if buf.len() < end {
                return Ok(None);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err(FrameError::Protocol("bulk string not terminated by CRLF"));
            }
            Ok(Some(end))
        }
        b'*' | b'%' => {
            let Some((len, mut next)) = number_line(buf, pos + 1)? else {
                return Ok(None);
            };
            if len == -1 && kind == b'*' {
                return Ok(Some(next));
            }
            if depth + 1 > limits.max_depth {
                return Err(FrameError::TooBig {
                    what: "nesting depth",
                    len: depth as u64 + 1,
                    limit: limits.max_depth as u64,
                });
            }
            let what = if kind == b'*' {
                "array length"
            } else {
                "map length"
            };
            let count = length(len, limits.max_array, what)?;
            let items = if kind == b'%' { count * 2 } else { count };
            // Every element costs at least three bytes on the wire; count
            // them against the frame budget before reading any.
            spend(budget, items.saturating_mul(3), limits.max_frame)?;
            for _ in 0..items {
                match check_at(buf, next, depth + 1, limits, budget)? {
                    Some(n) => next = n,
                    None => return Ok(None),
                }
            }
            Ok(Some(next))
        }
        _ if limits.inline => {
            if depth > 0 {
                return Err(FrameError::Protocol("invalid frame type byte"));
            }
            match buf[pos..].iter().position(|&b| b == b'\n') {
                Some(i) if i <= limits.max_inline => Ok(Some(pos + i + 1)),
                Some(i) => Err(FrameError::TooBig {
                    what: "inline command",
                    len: i as u64,
                    limit: limits.max_inline as u64,
                }),
                None if buf.len() - pos > limits.max_inline => Err(FrameError::TooBig {
                    what: "inline command",
                    len: (buf.len() - pos) as u64,
                    limit: limits.max_inline as u64,
                }),
                None => Ok(None),
            }
        }
        _ => Err(FrameError::Protocol("invalid frame type byte")),
    }
}

fn spend(budget: &mut usize, n: usize, limit: usize) -> Result<(), FrameError> {
    match budget.checked_sub(n) {
        Some(left) => {
            *budget = left;
            Ok(())
        }
        None => Err(FrameError::TooBig {
            what: "frame size",
            len: (limit - *budget).saturating_add(n) as u64,
            limit: limit as u64,
        }),
    }
}

fn length(len: i64, limit: usize, what: &'static str) -> Result<usize, FrameError> {
    if len < 0 {
        return Err(FrameError::Protocol("negative length"));
    }
    let len = len as u64;
    if len > limit as u64 {
        return Err(FrameError::TooBig {
            what,
            len,
            limit: limit as u64,
        });
    }
    Ok(len as usize)
}

/// Finds the CRLF ending the line that starts at `start`; returns the line
/// and the position after the CRLF. Errors if the line exceeds `max` bytes.
fn find_line<'a>(
    buf: &'a [u8],
    start: usize,
    max: usize,
    what: &'static str,
) -> Result<Option<(&'a [u8], usize)>, FrameError> {
    let rest = buf.get(start..).unwrap_or_default();
    let window = &rest[..rest.len().min(max + 2)];
    match window.iter().position(|&b| b == b'\r') {
        Some(i) => match window.get(i + 1) {
            Some(b'\n') => Ok(Some((&rest[..i], start + i + 2))),
            Some(_) => Err(FrameError::Protocol("CR not followed by LF")),
            None if i < max + 1 => Ok(None),
            None => Err(FrameError::TooBig {
                what,
                len: i as u64,
                limit: max as u64,
            }),
        },
        None if rest.len() > max + 1 => Err(FrameError::TooBig {
            what,
            len: rest.len() as u64,
            limit: max as u64,
        }),
        None => Ok(None),
    }
}

/// A short fixed-format line (number, null, boolean, double): an overlong
/// one is malformed rather than too big.
fn small_line(buf: &[u8], start: usize, max: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    match find_line(buf, start, max, "line") {
        Err(FrameError::TooBig { .. }) => Err(FrameError::Protocol("malformed line")),
        other => other,
    }
}

fn number_line(buf: &[u8], start: usize) -> Result<Option<(i64, usize)>, FrameError> {
    match small_line(buf, start, MAX_NUMBER_LINE)? {
        Some((line, next)) => Ok(Some((
            parse_i64(line).ok_or(FrameError::Protocol("invalid number"))?,
            next,
        ))),
        None => Ok(None),
    }
}

/// Parses a decimal `i64` written the RESP way (optional `-`, digits only).
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub((d - b'0') as i64)?
        } else {
            v.checked_add((d - b'0') as i64)?
        };
    }
    Some(v)
}

/// Parses a decimal `u64` (digits only, no sign).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &d in s {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(v)
}

/// Pass two: parses the complete frame held in `bytes` (as measured by
/// [`check`]). Strings are slices of `bytes`. Returns `None` for a request
/// with nothing in it: an empty inline line, or (reading requests, as
/// [`Limits::inline`] says) an empty or null array, `*0` or `*-1`, which
/// Redis skips without a reply too.
pub fn parse(bytes: &Bytes, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    let mut pos = 0;
    match bytes.first() {
        Some(b'+' | b'-' | b':' | b'$' | b'*' | b'_' | b'#' | b',' | b'%') => {
            let frame = parse_at(bytes, &mut pos)?;
            if limits.inline
                && bytes[0] == b'*'
                && match &frame {
                    Frame::Null => true,
                    Frame::Array(items) => items.is_empty(),
                    _ => false,
                }
            {
                return Ok(None);
            }
            Ok(Some(frame))
        }
        Some(_) if limits.inline => parse_inline(bytes, limits.max_array),
        _ => Err(FrameError::Protocol("invalid frame type byte")),
    }
}

/// Splits an inline command line as Redis does (`sdssplitargs`): on
/// whitespace, with "double quotes" (escapes `\n \r \t \b \a \\ \"` and
/// `\xHH`) and 'single quotes' (escape `\'`), a closing quote being followed
/// by whitespace or the end. Arguments without quotes are slices of
/// `bytes`. At most `max_args` of them, as in an array (a 64 KiB line
/// holds 32K: an inline `COMMAND INFO` of ten thousand names was answered
/// with 550 KB).
fn parse_inline(bytes: &Bytes, max_args: usize) -> Result<Option<Frame>, FrameError> {
    const UNBALANCED: FrameError = FrameError::Protocol("unbalanced quotes in request");
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut args = Vec::new();
    let mut count = 0;
    let mut i = 0;
    loop {
        while i < end && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= end {
            break;
        }
        let start = i;
        // Owned only once a quote is met.
        let mut owned: Option<Vec<u8>> = None;
        while i < end && !bytes[i].is_ascii_whitespace() {
            let quote = bytes[i];
            if quote != b'"' && quote != b'\'' {
                if let Some(o) = owned.as_mut() {
                    o.push(quote);
                }
                i += 1;
                continue;
            }
            let out = owned.get_or_insert_with(|| bytes[start..i].to_vec());
            i += 1;
            loop {
                let Some(&c) = bytes[..end].get(i) else {
                    return Err(UNBALANCED);
                };
                if c == quote {
                    i += 1;
                    if i < end && !bytes[i].is_ascii_whitespace() {
                        return Err(UNBALANCED);
                    }
                    break;
                }
                if quote == b'"'
                    && c == b'\\'
                    && i + 3 < end
                    && bytes[i + 1] == b'x'
                    && let (Some(h), Some(l)) = (hex(bytes[i + 2]), hex(bytes[i + 3]))
                {
                    out.push(h * 16 + l);
                    i += 4;
                    continue;
                }
                if c == b'\\' && i + 1 < end {
                    let next = bytes[i + 1];
                    let escaped = match (quote, next) {
                        (b'"', b'n') => Some(b'\n'),
                        (b'"', b'r') => Some(b'\r'),
                        (b'"', b't') => Some(b'\t'),
                        (b'"', b'b') => Some(8),
                        (b'"', b'a') => Some(7),
                        (b'"', other) => Some(other),
                        (_, b'\'') => Some(b'\''),
                        _ => None,
                    };
                    if let Some(e) = escaped {
                        out.push(e);
                        i += 2;
                        continue;
                    }
                }
                out.push(c);
                i += 1;
            }
        }
        count += 1;
        if count <= max_args {
            args.push(Frame::Bulk(match owned {
                Some(o) => Bytes::from(o),
                None => bytes.slice(start..i),
            }));
        }
    }
    if count > max_args {
        return Err(FrameError::TooBig {
            what: "array length",
            len: count as u64,
            limit: max_args as u64,
        });
    }
    Ok(if args.is_empty() {
        None
    } else {
        Some(Frame::Array(args))
    })
}

fn line(bytes: &Bytes, pos: &mut usize) -> Result<(usize, usize), FrameError> {
    let start = *pos;
    let rest = bytes
        .get(start..)
        .ok_or(FrameError::Protocol("truncated frame"))?;
    let i = rest
        .iter()
        .position(|&b| b == b'\r')
        .ok_or(FrameError::Protocol("truncated frame"))?;
    *pos = start + i + 2;
    if *pos > bytes.len() {
        return Err(FrameError::Protocol("truncated frame"));
    }
    Ok((start, start + i))
}

fn parse_at(bytes: &Bytes, pos: &mut usize) -> Result<Frame, FrameError> {
    let kind = *bytes
        .get(*pos)
        .ok_or(FrameError::Protocol("truncated frame"))?;
    *pos += 1;
    let (a, b) = line(bytes, pos)?;
    let text = &bytes[a..b];
    let number = || parse_i64(text).ok_or(FrameError::Protocol("invalid number"));
    Ok(match kind {
        b'+' => Frame::Simple(bytes.slice(a..b)),
        b'-' => Frame::Error(bytes.slice(a..b)),
        b':' => Frame::Integer(number()?),
        b'_' => Frame::Null,
        b'#' => Frame::Boolean(text == b"t"),
        b',' => {
            let s =
                std::str::from_utf8(text).map_err(|_| FrameError::Protocol("invalid double"))?;
            let v = match s {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                _ => s
                    .parse()
                    .map_err(|_| FrameError::Protocol("invalid double"))?,
            };
            Frame::Double(v)
        }
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Frame::Null);
            }
            let start = *pos;
            let end = start + n as usize;
            if end + 2 > bytes.len() {
                return Err(FrameError::Protocol("truncated frame"));
            }
            *pos = end + 2;
            Frame::Bulk(bytes.slice(start..end))
        }
        b'*' => {
            let n = number()?;
            if n < 0 {
                return Ok(Frame::Null);
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(parse_at(bytes, pos)?);
            }
            Frame::Array(items)
        }
        b'%' => {
            let n = number()?;
            let mut pairs = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let k = parse_at(bytes, pos)?;
                let v = parse_at(bytes, pos)?;
                pairs.push((k, v));
            }
            Frame::Map(pairs)
        }
        _ => return Err(FrameError::Protocol("invalid frame type byte")),
    })
}

/// Appends the wire form of `frame` to `dst` in the given protocol version.
pub fn encode(frame: &Frame, version: Version, dst: &mut BytesMut) {
    match frame {
        Frame::Simple(s) => line_out(dst, b'+', s),
        Frame::Error(s) => line_out(dst, b'-', s),
        Frame::Integer(n) => number_out(dst, b':', *n),
        Frame::Bulk(b) => bulk_out(dst, b),
        Frame::Array(items) => {
            number_out(dst, b'*', items.len() as i64);
            for item in items {
                encode(item, version, dst);
            }
        }
        Frame::Null => match version {
            Version::Resp2 => dst.extend_from_slice(b"$-1\r\n"),
            Version::Resp3 => dst.extend_from_slice(b"_\r\n"),
        },
        Frame::Map(pairs) => {
            match version {
                Version::Resp2 => number_out(dst, b'*', pairs.len() as i64 * 2),
                Version::Resp3 => number_out(dst, b'%', pairs.len() as i64),
            }
            for (k, v) in pairs {
                encode(k, version, dst);
                encode(v, version, dst);
            }
        }
        Frame::Boolean(b) => match version {
            Version::Resp2 => number_out(dst, b':', *b as i64),
            Version::Resp3 => dst.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
        },
        Frame::Double(d) => {
            let text = format_double(*d);
            match version {
                Version::Resp2 => bulk_out(dst, text.as_bytes()),
                Version::Resp3 => line_out(dst, b',', text.as_bytes()),
            }
        }
    }
}

fn format_double(d: f64) -> String {
    if d.is_infinite() {
        if d > 0.0 { "inf".into() } else { "-inf".into() }
    } else if d.is_nan() {
        "nan".into()
    } else {
        // Plain decimals, unless that is long (1e157 has 158 digits, over
        // what a double's line may hold): then with an exponent.
        let plain = format!("{d}");
        if plain.len() <= 32 {
            plain
        } else {
            format!("{d:e}")
        }
    }
}

pub(crate) fn line_out(dst: &mut BytesMut, kind: u8, s: &[u8]) {
    dst.reserve(s.len() + 3);
    dst.extend_from_slice(&[kind]);
    // A simple string or error may not contain CR or LF: replace them so the
    // stream stays in sync whatever the message carries.
    if s.iter().any(|&b| b == b'\r' || b == b'\n') {
        dst.extend(
            s.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        dst.extend_from_slice(s);
    }
    dst.extend_from_slice(b"\r\n");
}

pub(crate) fn number_out(dst: &mut BytesMut, kind: u8, n: i64) {
    let mut buf = itoa::Buffer::new();
    let s = buf.format(n);
    dst.reserve(s.len() + 3);
    dst.extend_from_slice(&[kind]);
    dst.extend_from_slice(s.as_bytes());
    dst.extend_from_slice(b"\r\n");
}

pub(crate) fn bulk_out(dst: &mut BytesMut, b: &[u8]) {
    number_out(dst, b'$', b.len() as i64);
    dst.reserve(b.len() + 2);
    dst.extend_from_slice(b);
    dst.extend_from_slice(b"\r\n");
}

/// Skips `n` bytes of `buf` (helper for callers discarding input).
pub fn skip(buf: &mut BytesMut, n: usize) {
    buf.advance(n.min(buf.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(input: &[u8]) -> Result<Option<Frame>, FrameError> {
        let mut buf = BytesMut::from(input);
        decode(&mut buf, &Limits::default())
    }

    fn enc(frame: &Frame, v: Version) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode(frame, v, &mut out);
        out.to_vec()
    }

    /// Reading requests, an empty or null array is skipped without a reply,
    /// as an empty inline line is (and as Redis does); reading replies, it
    /// is a frame.
    #[test]
    fn an_empty_or_null_array_request_is_skipped() {
        // The default limits are a server's (inline commands on).
        let server = Limits::default();
        for skipped in [&b"*0\r\n"[..], b"*-1\r\n", b"\r\n", b"*0\r\n*-1\r\n\r\n"] {
            let mut buf = BytesMut::from(skipped);
            assert_eq!(decode(&mut buf, &server).unwrap(), None, "{skipped:?}");
            assert!(buf.is_empty(), "{skipped:?} was not consumed");
            let mut buf = BytesMut::from(skipped);
            let mut d = Decoder::new();
            assert_eq!(d.decode(&mut buf, &server).unwrap(), None, "{skipped:?}");
            assert!(buf.is_empty(), "{skipped:?} was not consumed");
        }
        let mut buf = BytesMut::from(&b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n"[..]);
        assert_eq!(
            decode(&mut buf, &server).unwrap(),
            Some(Frame::Array(vec![Frame::bulk("PING")]))
        );
        // Inside a request, or in a reply, they are frames as any other.
        assert_eq!(
            decode(&mut BytesMut::from(&b"*1\r\n*0\r\n"[..]), &server).unwrap(),
            Some(Frame::Array(vec![Frame::Array(vec![])]))
        );
        let replies = Limits::for_replies();
        assert_eq!(
            decode(&mut BytesMut::from(&b"*0\r\n"[..]), &replies).unwrap(),
            Some(Frame::Array(vec![]))
        );
        assert_eq!(
            decode(&mut BytesMut::from(&b"*-1\r\n"[..]), &replies).unwrap(),
            Some(Frame::Null)
        );
    }

    #[test]
    fn decodes_every_type() {
        assert_eq!(dec(b"+OK\r\n").unwrap(), Some(Frame::simple("OK")));
        assert_eq!(
            dec(b"-ERR x\r\n").unwrap(),
            Some(Frame::Error(Bytes::from_static(b"ERR x")))
        );
        assert_eq!(dec(b":-42\r\n").unwrap(), Some(Frame::Integer(-42)));
        assert_eq!(dec(b"$3\r\nabc\r\n").unwrap(), Some(Frame::bulk("abc")));
        assert_eq!(dec(b"$0\r\n\r\n").unwrap(), Some(Frame::bulk("")));
        assert_eq!(dec(b"$-1\r\n").unwrap(), Some(Frame::Null));
        assert_eq!(dec(b"_\r\n").unwrap(), Some(Frame::Null));
        assert_eq!(dec(b"#t\r\n").unwrap(), Some(Frame::Boolean(true)));
        assert_eq!(dec(b",1.5\r\n").unwrap(), Some(Frame::Double(1.5)));
        assert_eq!(
            dec(b"%1\r\n+a\r\n:1\r\n").unwrap(),
            Some(Frame::Map(vec![(Frame::simple("a"), Frame::Integer(1))]))
        );
        assert_eq!(
            dec(b"*2\r\n$4\r\nPING\r\n*0\r\n").unwrap(),
            Some(Frame::Array(vec![
                Frame::bulk("PING"),
                Frame::Array(vec![])
            ]))
        );
    }

    #[test]
    fn inline_commands_hold_no_more_arguments_than_an_array() {
        let max = Limits::default().max_array;
        let line = |n: usize| {
            let mut l = b"COMMAND INFO".to_vec();
            for _ in 2..n {
                l.extend_from_slice(b" claim");
            }
            l.extend_from_slice(b"\r\n");
            l
        };
        let Some(Frame::Array(args)) = dec(&line(max)).unwrap() else {
            panic!("an inline command of {max} arguments")
        };
        assert_eq!(args.len(), max);
        assert_eq!(
            dec(&line(max + 5)).unwrap_err(),
            FrameError::TooBig {
                what: "array length",
                len: max as u64 + 5,
                limit: max as u64,
            }
        );
    }

    #[test]
    fn inline_commands_split_on_whitespace() {
        assert_eq!(
            dec(b"CLAIM  k1 LEASE 10\r\n").unwrap(),
            Some(Frame::command(["CLAIM", "k1", "LEASE", "10"]))
        );
        assert_eq!(dec(b"PING\n").unwrap(), Some(Frame::command(["PING"])));
        // Empty lines are skipped.
        assert_eq!(
            dec(b"\r\n\r\nPING\r\n").unwrap(),
            Some(Frame::command(["PING"]))
        );
        assert_eq!(dec(b"\r\n").unwrap(), None);
    }

    /// Inline commands quote as redis-cli users expect: `CLAIM ""` claims
    /// the empty key, not the two-character key `""`.
    #[test]
    fn inline_commands_take_quotes_and_escapes_as_redis_does() {
        let cases: Vec<(&[u8], Vec<&[u8]>)> = vec![
            (b"CLAIM \"\"\r\n", vec![b"CLAIM", b""]),
            (b"SET \"a b\" 'c d'\r\n", vec![b"SET", b"a b", b"c d"]),
            (b"X \"q\\\"x\\n\\x41\\x4g\"\r\n", vec![b"X", b"q\"x\nAx4g"]),
            (b"X 'it\\'s' \"\\\\\"\n", vec![b"X", b"it's", b"\\"]),
            (b"X ab\"c d\"e\r\n", vec![]),
            (b"X ab\"c d\" e\r\n", vec![b"X", b"abc d", b"e"]),
            (b"X 'x\\n'\r\n", vec![b"X", b"x\\n"]),
        ];
        for (line, want) in cases {
            let got = dec(line);
            if want.is_empty() {
                assert!(
                    matches!(got, Err(FrameError::Protocol(m)) if m.contains("unbalanced")),
                    "{line:?}: {got:?}"
                );
            } else {
                let want = Frame::Array(
                    want.iter()
                        .map(|a| Frame::Bulk(Bytes::copy_from_slice(a)))
                        .collect(),
                );
                assert_eq!(got.unwrap(), Some(want), "{line:?}");
            }
        }
        for bad in [&b"X \"open\r\n"[..], b"X 'open\r\n", b"X \"a\"b\r\n"] {
            assert!(
                matches!(dec(bad), Err(FrameError::Protocol(m)) if m.contains("unbalanced")),
                "{bad:?}"
            );
        }
    }

    /// The decoder used to look at a pending frame again on every read: a
    /// 60 KB inline line or a RESP array trickled a byte at a time cost
    /// work quadratic in its length. Now it looks again only when a `\n`
    /// arrives.
    #[test]
    fn a_frame_trickled_a_byte_at_a_time_is_checked_once_per_line() {
        let limits = Limits::default();
        let mut line = b"CLAIM ".to_vec();
        line.extend(std::iter::repeat_n(b'k', 60_000));
        line.extend_from_slice(b"\r\n");
        let mut resp = BytesMut::new();
        encode(
            &Frame::command(["CLAIM", "key", "LEASE", "5000"]),
            Version::Resp2,
            &mut resp,
        );
        for (input, lines) in [(line, 1u64), (resp.to_vec(), 9)] {
            let mut d = Decoder::new();
            let mut buf = BytesMut::new();
            let mut got = None;
            for &b in &input {
                buf.extend_from_slice(&[b]);
                if let Some(f) = d.decode(&mut buf, &limits).unwrap() {
                    got = Some(f);
                }
            }
            assert!(got.is_some(), "the frame was decoded");
            assert!(buf.is_empty());
            // The first byte, then one look per line end at most.
            assert!(
                d.checks() <= 1 + lines,
                "{} checks for {} bytes",
                d.checks(),
                input.len()
            );
        }
        // Errors are still found at once: a bad first byte, and an inline
        // line past its limit.
        let mut d = Decoder::new();
        let mut buf = BytesMut::from(&b"!"[..]);
        assert!(d.decode(&mut buf, &Limits::for_replies()).is_err());
        let small = Limits {
            max_inline: 16,
            ..Limits::default()
        };
        let mut d = Decoder::new();
        let mut buf = BytesMut::new();
        let mut failed = false;
        for _ in 0..40 {
            buf.extend_from_slice(b"a");
            if d.decode(&mut buf, &small).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an inline line past max_inline is refused");
        assert!(buf.len() <= 18, "refused within the limit: {}", buf.len());
    }

    #[test]
    fn incomplete_is_not_an_error() {
        for input in [
            &b"$3\r\nab"[..],
            b"*2\r\n$1\r\na\r\n",
            b"+OK\r",
            b":1",
            b"$",
            b"*1\r\n",
            b"PING",
        ] {
            assert_eq!(dec(input).unwrap(), None, "{input:?}");
        }
    }

    #[test]
    fn malformed_input_is_rejected() {
        for input in [
            &b"$x\r\n"[..],
            b"*1\r\n!\r\n",
            b"$3\r\nabcde\r\n",
            b":1\rx",
            b"$-2\r\n",
            b"#x\r\n",
            b":\r\n",
        ] {
            assert!(
                matches!(dec(input), Err(FrameError::Protocol(_))),
                "{input:?}"
            );
        }
    }

    #[test]
    fn lengths_over_limits_fail_before_payload_arrives() {
        assert!(matches!(
            dec(b"$2147483647\r\n"),
            Err(FrameError::TooBig {
                what: "bulk length",
                ..
            })
        ));
        assert!(matches!(
            dec(b"*2147483647\r\n"),
            Err(FrameError::TooBig {
                what: "array length",
                ..
            })
        ));
        let limits = Limits {
            max_frame: 100,
            ..Limits::default()
        };
        let mut buf = BytesMut::from(&b"*3\r\n$60\r\n"[..]);
        buf.extend_from_slice(&[b'a'; 60]);
        buf.extend_from_slice(b"\r\n$60\r\n");
        assert!(matches!(
            decode(&mut buf, &limits),
            Err(FrameError::TooBig {
                what: "frame size",
                ..
            })
        ));
        let deep = b"*1\r\n".repeat(20);
        assert!(matches!(
            dec(&deep),
            Err(FrameError::TooBig {
                what: "nesting depth",
                ..
            })
        ));
        let long = vec![b'a'; 70 * 1024];
        assert!(matches!(
            dec(&long),
            Err(FrameError::TooBig {
                what: "inline command",
                ..
            })
        ));
        let long_simple = [&b"+"[..], &[b'a'; 70 * 1024]].concat();
        assert!(matches!(dec(&long_simple), Err(FrameError::TooBig { .. })));
    }

    #[test]
    fn replies_mode_rejects_inline() {
        let mut buf = BytesMut::from(&b"PING\r\n"[..]);
        assert!(decode(&mut buf, &Limits::for_replies()).is_err());
    }

    #[test]
    fn decoded_strings_share_the_read_buffer() {
        let mut buf = BytesMut::from(&b"*1\r\n$5\r\nhello\r\n+OK\r\n"[..]);
        let frame = decode(&mut buf, &Limits::default()).unwrap().unwrap();
        assert_eq!(&buf[..], b"+OK\r\n");
        let Frame::Array(items) = frame else {
            panic!("not an array")
        };
        let Frame::Bulk(b) = &items[0] else {
            panic!("not a bulk")
        };
        assert_eq!(&b[..], b"hello");
    }

    #[test]
    fn resp2_and_resp3_encodings() {
        let map = Frame::Map(vec![(Frame::simple("a"), Frame::Boolean(true))]);
        assert_eq!(enc(&map, Version::Resp2), b"*2\r\n+a\r\n:1\r\n");
        assert_eq!(enc(&map, Version::Resp3), b"%1\r\n+a\r\n#t\r\n");
        assert_eq!(enc(&Frame::Null, Version::Resp2), b"$-1\r\n");
        assert_eq!(enc(&Frame::Null, Version::Resp3), b"_\r\n");
        assert_eq!(enc(&Frame::Double(2.5), Version::Resp2), b"$3\r\n2.5\r\n");
        assert_eq!(enc(&Frame::Double(2.5), Version::Resp3), b",2.5\r\n");
        // Huge and tiny ones take an exponent, and decode back (found by
        // the `frames` fuzz target: 1e157 written out in full was longer
        // than the decoder takes).
        for d in [1e157, -1e300, 1e-300, f64::MAX, f64::MIN_POSITIVE] {
            let out = enc(&Frame::Double(d), Version::Resp3);
            let mut buf = bytes::BytesMut::from(&out[..]);
            assert_eq!(
                decode(&mut buf, &Limits::for_replies()),
                Ok(Some(Frame::Double(d))),
                "{d}"
            );
        }
        assert_eq!(
            enc(
                &Frame::Error(Bytes::from_static(b"ERR a\r\nb")),
                Version::Resp2
            ),
            b"-ERR a  b\r\n"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
    }
}
