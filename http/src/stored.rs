//! A response as stored in Idem (the value of the COMPLETE) and replayed.
//!
//! ```text
//! u8 format (1) | u8 flags | u16 status | u16 header count
//! per header: u16 name length, name, u32 value length, value
//! body (the rest)
//! ```
//!
//! Flag [`BODY_NOT_STORED`]: the body was larger than the limit and went
//! to the first caller only; replays answer an error instead of a
//! truncated body.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const FORMAT: u8 = 1;
/// Headers a stored response may carry, at most.
pub(crate) const MAX_HEADERS: usize = 64;
/// The body was too large to store.
const BODY_NOT_STORED: u8 = 1;

/// A stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `None`: the body was not stored.
    pub body: Option<Bytes>,
}

impl Stored {
    /// The headers of `headers` named in `allow`, at most [`MAX_HEADERS`]
    /// (more could be stored but not replayed: decoding refuses them).
    pub(crate) fn pick(
        headers: &HeaderMap,
        allow: &[HeaderName],
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::new();
        for name in allow {
            for v in headers.get_all(name) {
                if out.len() == MAX_HEADERS {
                    return out;
                }
                out.push((name.clone(), v.clone()));
            }
        }
        out
    }

    /// Bytes the headers take in the encoding.
    pub(crate) fn header_bytes(headers: &[(HeaderName, HeaderValue)]) -> usize {
        6 + headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum::<usize>()
    }

    pub(crate) fn encode(&self) -> Bytes {
        let body = self.body.as_ref().map_or(0, Bytes::len);
        let mut out = BytesMut::with_capacity(Self::header_bytes(&self.headers) + body);
        out.put_u8(FORMAT);
        out.put_u8(if self.body.is_some() {
            0
        } else {
            BODY_NOT_STORED
        });
        out.put_u16(self.status.as_u16());
        out.put_u16(self.headers.len().min(u16::MAX as usize) as u16);
        for (n, v) in self.headers.iter().take(u16::MAX as usize) {
            out.put_u16(n.as_str().len() as u16);
            out.put_slice(n.as_str().as_bytes());
            out.put_u32(v.len() as u32);
            out.put_slice(v.as_bytes());
        }
        if let Some(b) = &self.body {
            out.put_slice(b);
        }
        out.freeze()
    }

    /// `None` if `b` is not a stored response of this format (a value some
    /// other client wrote under the key).
    pub(crate) fn decode(b: &Bytes) -> Option<Stored> {
        let mut at = 0usize;
        let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
            let s = b.get(*at..at.checked_add(n)?)?;
            *at += n;
            Some(s)
        };
        let head = take(&mut at, 6)?;
        if head[0] != FORMAT {
            return None;
        }
        let flags = head[1];
        let status = StatusCode::from_u16(u16::from_be_bytes([head[2], head[3]])).ok()?;
        let count = u16::from_be_bytes([head[4], head[5]]) as usize;
        // Each header takes at least 6 bytes, and a stored response has at
        // most MAX_HEADERS: a hostile value cannot make this allocate.
        if count > MAX_HEADERS || count > (b.len() - at) / 6 {
            return None;
        }
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let l = take(&mut at, 2)?;
            let nl = u16::from_be_bytes([l[0], l[1]]) as usize;
            let name = HeaderName::from_bytes(take(&mut at, nl)?).ok()?;
            let l = take(&mut at, 4)?;
            let vl = u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize;
            let value = HeaderValue::from_bytes(take(&mut at, vl)?).ok()?;
            headers.push((name, value));
        }
        let body = (flags & BODY_NOT_STORED == 0).then(|| b.slice(at..));
        Some(Stored {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response with more allowed header values than a stored one may
    /// carry was stored, and every replay of it failed to decode.
    #[test]
    fn picked_headers_stay_decodable() {
        let mut headers = HeaderMap::new();
        let link = HeaderName::from_static("link");
        for i in 0..MAX_HEADERS + 5 {
            headers.append(&link, HeaderValue::from_str(&format!("</p/{i}>")).unwrap());
        }
        let picked = Stored::pick(&headers, std::slice::from_ref(&link));
        assert_eq!(picked.len(), MAX_HEADERS);
        let s = Stored {
            status: StatusCode::CREATED,
            headers: picked,
            body: Some(Bytes::from_static(b"ok")),
        };
        assert_eq!(Stored::decode(&s.encode()), Some(s));
    }

    #[test]
    fn a_response_round_trips() {
        let s = Stored {
            status: StatusCode::CREATED,
            headers: vec![
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    http::header::LOCATION,
                    HeaderValue::from_static("/payments/7"),
                ),
            ],
            body: Some(Bytes::from_static(b"{\"id\":7}")),
        };
        assert_eq!(Stored::decode(&s.encode()), Some(s.clone()));
        let marker = Stored { body: None, ..s };
        assert_eq!(Stored::decode(&marker.encode()), Some(marker));
    }

    #[test]
    fn a_hostile_header_count_is_refused() {
        let mut v = vec![FORMAT, 0, 0, 200, 0xff, 0xff];
        v.extend_from_slice(&[0; 64]);
        assert_eq!(Stored::decode(&Bytes::from(v)), None);
    }

    #[test]
    fn foreign_or_cut_values_are_not_read() {
        assert_eq!(Stored::decode(&Bytes::from_static(b"hello")), None);
        let s = Stored {
            status: StatusCode::OK,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain"),
            )],
            body: Some(Bytes::from_static(b"ok")),
        }
        .encode();
        for cut in 1..10 {
            assert_eq!(Stored::decode(&s.slice(..cut)), None, "cut at {cut}");
        }
    }
}
