//! The `Idempotency-Key` header: a Structured-Field string (`"abc"`, as
//! the IETF draft writes it) or a bare token (`abc`, as Stripe's clients
//! send it).

use http::HeaderValue;

/// Why a header value is not a usable key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BadKey {
    /// Empty, or only quotes.
    Empty,
    /// Longer than the limit.
    TooLong(usize),
    /// A byte outside printable ASCII, a bare `"` or `\`, or a bad escape.
    BadCharacter,
    /// More than one `Idempotency-Key` header.
    Repeated,
}

impl std::fmt::Display for BadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadKey::Empty => f.write_str("the Idempotency-Key header is empty"),
            BadKey::TooLong(max) => write!(f, "the Idempotency-Key is longer than {max} characters"),
            BadKey::BadCharacter => f.write_str(
                "the Idempotency-Key must be a string of printable ASCII characters: quoted (\"abc\", with \\\" and \\\\ escapes) or bare (abc, without quotes or backslashes)",
            ),
            BadKey::Repeated => f.write_str("the request has more than one Idempotency-Key header"),
        }
    }
}

/// The key in `value`, at most `max_len` characters once unquoted.
pub(crate) fn parse(value: &HeaderValue, max_len: usize) -> Result<String, BadKey> {
    let raw = value.as_bytes();
    let trimmed = trim(raw);
    let key = match trimmed {
        [b'"', rest @ ..] => unquote(rest)?,
        bare => {
            // No quotes, backslashes or commas (two header lines a proxy
            // folded into one are refused, not taken as one key).
            if bare
                .iter()
                .any(|b| !(0x21..=0x7e).contains(b) || matches!(b, b'"' | b'\\' | b','))
            {
                return Err(BadKey::BadCharacter);
            }
            String::from_utf8(bare.to_vec()).map_err(|_| BadKey::BadCharacter)?
        }
    };
    if key.is_empty() {
        return Err(BadKey::Empty);
    }
    if key.len() > max_len {
        return Err(BadKey::TooLong(max_len));
    }
    Ok(key)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| *c != b' ' && *c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| *c != b' ' && *c != b'\t')
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

/// An sf-string after its opening quote: printable ASCII, `\"` and `\\`
/// escapes only, up to the closing quote; Structured-Field parameters
/// after it (`;name=value`) are allowed and ignored.
fn unquote(rest: &[u8]) -> Result<String, BadKey> {
    let mut out = String::with_capacity(rest.len());
    let mut bytes = rest.iter().enumerate();
    while let Some((i, &b)) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some((_, &e @ (b'"' | b'\\'))) => out.push(e as char),
                _ => return Err(BadKey::BadCharacter),
            },
            b'"' => {
                return match &rest[i + 1..] {
                    [] | [b';', ..] => Ok(out),
                    _ => Err(BadKey::BadCharacter),
                };
            }
            0x20..=0x7e => out.push(b as char),
            _ => return Err(BadKey::BadCharacter),
        }
    }
    // No closing quote.
    Err(BadKey::BadCharacter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<String, BadKey> {
        parse(&HeaderValue::from_str(s).unwrap(), 16)
    }

    #[test]
    fn quoted_and_bare_forms_give_the_same_key() {
        assert_eq!(p("\"abc-123\""), Ok("abc-123".into()));
        assert_eq!(p("abc-123"), Ok("abc-123".into()));
        assert_eq!(p("  abc-123 "), Ok("abc-123".into()));
        assert_eq!(p("\"a \\\"b\\\\\""), Ok("a \"b\\".into()));
        assert_eq!(p("\"abc\";v=1"), Ok("abc".into()));
    }

    #[test]
    fn bad_keys_are_refused() {
        assert_eq!(p(""), Err(BadKey::Empty));
        assert_eq!(p("\"\""), Err(BadKey::Empty));
        assert_eq!(p("\"abc"), Err(BadKey::BadCharacter));
        assert_eq!(p("a b"), Err(BadKey::BadCharacter));
        assert_eq!(p("a\"b"), Err(BadKey::BadCharacter));
        assert_eq!(p("a\\b"), Err(BadKey::BadCharacter));
        assert_eq!(p("k1,k2"), Err(BadKey::BadCharacter));
        assert_eq!(p("\"abc\"x"), Err(BadKey::BadCharacter));
        assert_eq!(p("\"a\\nb\""), Err(BadKey::BadCharacter));
        assert_eq!(p("\"a\"b\""), Err(BadKey::BadCharacter));
        assert_eq!(p("0123456789abcdefg"), Err(BadKey::TooLong(16)));
        let latin1 = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert_eq!(parse(&latin1, 16), Err(BadKey::BadCharacter));
    }
}
