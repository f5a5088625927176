//! One error type, classified by [`ErrorKind`] and predicates; never match
//! on message text.

use std::fmt;

use idem_protocol::{ErrorCode, ServerError};

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Connecting or talking to the server failed (the request may or may
    /// not have reached it).
    Io,
    /// No reply within the request timeout (the request may have run).
    Timeout,
    /// The connection closed before the reply arrived.
    ConnectionClosed,
    /// The caller's fence no longer owns the key (`-FENCED`).
    Fenced,
    /// The fingerprint differs from the first request's (`-MISMATCH`).
    Mismatch,
    /// An argument or frame over a server limit (`-TOOBIG`).
    TooBig,
    /// The server is full and refuses new claims (`-OOM`).
    Oom,
    /// The node is not the leader (`-MOVED`) and redirects ran out.
    Moved,
    /// No leader for longer than an election timeout (`-CLUSTERDOWN`),
    /// until the call's deadline.
    ClusterDown,
    /// The server asked to try again later (`-TRYAGAIN`) and retries ran out.
    TryAgain,
    /// Authentication problems (`-NOAUTH`, `-WRONGPASS`): no or wrong
    /// credentials, or the user is off.
    Auth,
    /// The user may not run this command, or not on this key (`-NOPERM`):
    /// its ACL rules do not allow it.
    NoPerm,
    /// The TLS handshake failed: the server's certificate is not trusted
    /// or does not name it, or the server refused (or wanted) a client
    /// certificate.
    Tls,
    /// A request the server refused as invalid (`-ERR`, `-NOPROTO`).
    InvalidRequest,
    /// The server's reply did not match the protocol.
    Protocol,
    /// The server's address could not be parsed or resolved.
    InvalidAddress,
    /// The peer answered, but is not an Idem server (Redis, an HTTP
    /// server...).
    NotIdem,
}

/// An error from the client.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    detail: String,
    attempt: Option<bytes::Bytes>,
    /// Whether the request may have taken effect (see [`Error::may_have_run`]).
    may_have_run: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The words every `-TRYAGAIN` sent after a request was proposed carries
/// (PROTOCOL.md, "Clusters"); any other `-TRYAGAIN` was not applied.
pub(crate) const MAY_HAVE_BEEN_APPLIED: &str = "may have been applied";

/// Whether an error of `kind` leaves it open whether the request ran: it
/// may have reached the server before the connection or the time ran out.
fn unknown_kind(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Io | ErrorKind::Timeout | ErrorKind::ConnectionClosed
    )
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Error {
            kind,
            detail: detail.into(),
            attempt: None,
            may_have_run: unknown_kind(kind),
            source: None,
        }
    }

    /// Whether the request may have taken effect although this error came
    /// back: a try of it timed out, lost its connection, or was answered
    /// `-TRYAGAIN` after the server had proposed it ("... may have been
    /// applied"). False when every try was refused before it could run
    /// (`-MOVED`, `-CLUSTERDOWN`, `-TRYAGAIN` while no leader is known or
    /// writes are queued too deep, and every other refusal). A claim that
    /// may have run is looked for and let go by the client (see
    /// [`Client::claim`](crate::Client::claim)); its attempt id is in
    /// [`Error::attempt`].
    pub fn may_have_run(&self) -> bool {
        self.may_have_run
    }

    /// The same error, marked as one whose request may have run if an
    /// earlier try of it may have.
    pub(crate) fn or_may_have_run(mut self, earlier: bool) -> Self {
        self.may_have_run |= earlier;
        self
    }

    /// The attempt id of the claim that failed, if a claim did: with it,
    /// `INSPECT` tells whether that claim owns the key after all.
    pub fn attempt(&self) -> Option<&bytes::Bytes> {
        self.attempt.as_ref()
    }

    /// The same error, naming the attempt id of the claim that failed.
    pub(crate) fn with_attempt(mut self, attempt: Option<bytes::Bytes>) -> Self {
        self.attempt = attempt;
        self
    }

    /// The same error, its detail led by `context` (what was asked of whom).
    pub(crate) fn with_context(mut self, context: impl fmt::Display) -> Self {
        self.detail = format!("{context}: {}", self.detail);
        self
    }

    /// The same kind and detail, without the source (errors are not
    /// `Clone`: a source may not be).
    pub(crate) fn shallow_clone(&self) -> Self {
        Error::new(self.kind, self.detail.clone()).or_may_have_run(self.may_have_run)
    }

    /// What went wrong, without the kind.
    pub(crate) fn detail(&self) -> &str {
        &self.detail
    }

    pub(crate) fn io(e: std::io::Error) -> Self {
        #[cfg(feature = "tls")]
        let tls = e
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
        #[cfg(not(feature = "tls"))]
        let tls = false;
        Error {
            kind: if tls { ErrorKind::Tls } else { ErrorKind::Io },
            detail: e.to_string(),
            attempt: None,
            may_have_run: !tls,
            source: Some(Box::new(e)),
        }
    }

    pub(crate) fn server(e: ServerError) -> Self {
        let kind = match e.code {
            ErrorCode::Fenced => ErrorKind::Fenced,
            ErrorCode::Mismatch => ErrorKind::Mismatch,
            ErrorCode::TooBig => ErrorKind::TooBig,
            ErrorCode::Oom => ErrorKind::Oom,
            ErrorCode::Moved => ErrorKind::Moved,
            ErrorCode::ClusterDown => ErrorKind::ClusterDown,
            ErrorCode::TryAgain => ErrorKind::TryAgain,
            ErrorCode::NoAuth | ErrorCode::WrongPass => ErrorKind::Auth,
            ErrorCode::NoPerm => ErrorKind::NoPerm,
            _ => ErrorKind::InvalidRequest,
        };
        Error {
            kind,
            may_have_run: kind == ErrorKind::TryAgain && e.message.contains(MAY_HAVE_BEEN_APPLIED),
            detail: e.to_string(),
            attempt: None,
            source: Some(Box::new(e)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The server's error reply, if this error is one.
    pub fn server_error(&self) -> Option<&ServerError> {
        self.source
            .as_ref()
            .and_then(|s| s.downcast_ref::<ServerError>())
    }

    /// A stale owner: its lease lapsed and the key moved on.
    pub fn is_fenced(&self) -> bool {
        self.kind == ErrorKind::Fenced
    }

    /// The key was reused with a different payload.
    pub fn is_mismatch(&self) -> bool {
        self.kind == ErrorKind::Mismatch
    }

    /// No reply in time; the request may have run.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// The connection failed; the request may have run.
    pub fn is_connection(&self) -> bool {
        matches!(self.kind, ErrorKind::Io | ErrorKind::ConnectionClosed)
    }

    /// What a server restarting (or a node going away) gives: the
    /// connection was refused, reset or closed. Retried until the call's
    /// deadline, not `retries` times; a host name that does not resolve,
    /// say, is not this.
    pub(crate) fn is_restart_like(&self) -> bool {
        use std::io::ErrorKind as Io;
        match self.kind {
            ErrorKind::ConnectionClosed => true,
            ErrorKind::Io => self
                .source
                .as_deref()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        Io::ConnectionRefused
                            | Io::ConnectionReset
                            | Io::ConnectionAborted
                            | Io::BrokenPipe
                            | Io::UnexpectedEof
                            | Io::NotConnected
                    )
                }),
            _ => false,
        }
    }

    /// Retrying the same request later may succeed (and is safe for every
    /// Idem command: claims carry an attempt id, owner calls a fence).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Io
                | ErrorKind::Timeout
                | ErrorKind::ConnectionClosed
                | ErrorKind::TryAgain
                | ErrorKind::Moved
                | ErrorKind::ClusterDown
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A server error's text leads with its own code (`FENCED ...`):
        // not repeated.
        if self.server_error().is_some() {
            write!(f, "{}", self.detail)
        } else {
            write!(f, "{:?}: {}", self.kind, self.detail)
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// A result with the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
