//! The layer's own answers, as RFC 9457 problem details
//! (`application/problem+json`). Each `type` is `urn:idem:problem:<name>`;
//! the README lists them.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};

use crate::ResponseBody;

/// A problem the layer answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// 400: the method needs an `Idempotency-Key` and the request has none.
    MissingKey,
    /// 400: the `Idempotency-Key` is empty, too long or malformed.
    InvalidKey,
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 413: the request body is larger than `max_request_bytes`.
    BodyTooLarge,
    /// 408: the request body did not arrive whole within `body_timeout`
    /// (nothing was claimed or run).
    BodyTimedOut,
    /// 422: the key was used before with another request (method, path,
    /// query or body).
    KeyReused,
    /// 409: a request with this key is still being processed (the wait ran
    /// out); retry after `Retry-After` seconds, unchanged.
    InFlight,
    /// 500: an earlier request with this key stopped without a known
    /// outcome (a 5xx, a panic, a timeout, a dropped connection), and this
    /// service does not run recoveries: the key stays unresolved until an
    /// operator resolves it (or a service with recovery claims it).
    OutcomeUnknown,
    /// 410: the original request completed, but its response was larger
    /// than the stored-response limit, so it cannot be replayed.
    ResponseNotStored,
    /// 503: the idempotency store cannot be reached; nothing was run.
    StoreUnavailable,
    /// 500: the idempotency store refused the request's key or fingerprint
    /// as too large (a configuration to fix: retrying cannot help);
    /// nothing was run.
    StoreRefused,
    /// 500: the handler panicked (the key is abandoned).
    HandlerPanicked,
    /// 504: the handler did not answer within the timeout (the key is
    /// abandoned).
    HandlerTimedOut,
}

impl Problem {
    /// Its HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::MissingKey | Problem::InvalidKey | Problem::UnreadableBody => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimedOut => StatusCode::REQUEST_TIMEOUT,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight => StatusCode::CONFLICT,
            Problem::OutcomeUnknown | Problem::HandlerPanicked | Problem::StoreRefused => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Problem::ResponseNotStored => StatusCode::GONE,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::HandlerTimedOut => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Its short name: the `type` is `urn:idem:problem:<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::InvalidKey => "invalid-key",
            Problem::UnreadableBody => "unreadable-body",
            Problem::BodyTooLarge => "body-too-large",
            Problem::BodyTimedOut => "body-timed-out",
            Problem::KeyReused => "key-reused",
            Problem::InFlight => "in-flight",
            Problem::OutcomeUnknown => "outcome-unknown",
            Problem::ResponseNotStored => "response-not-stored",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::StoreRefused => "store-refused",
            Problem::HandlerPanicked => "handler-panicked",
            Problem::HandlerTimedOut => "handler-timed-out",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "Idempotency-Key required",
            Problem::InvalidKey => "Invalid Idempotency-Key",
            Problem::UnreadableBody => "Request body unreadable",
            Problem::BodyTooLarge => "Request body too large",
            Problem::BodyTimedOut => "Request body not received in time",
            Problem::KeyReused => "Idempotency-Key reused with another request",
            Problem::InFlight => "Request with this Idempotency-Key in progress",
            Problem::OutcomeUnknown => "Outcome of an earlier request unknown",
            Problem::ResponseNotStored => "Original response not stored",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::StoreRefused => "Refused by the idempotency store",
            Problem::HandlerPanicked => "Request failed",
            Problem::HandlerTimedOut => "Request timed out",
        }
    }

    /// The response: status, `application/problem+json`, and the body.
    pub(crate) fn response(self, detail: &str) -> Response<ResponseBody> {
        let status = self.status();
        let body = format!(
            "{{\"type\":\"urn:idem:problem:{}\",\"title\":{},\"status\":{},\"detail\":{}}}",
            self.name(),
            json_string(self.title()),
            status.as_u16(),
            json_string(detail)
        );
        let mut r = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        r
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_escaped_json() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}
