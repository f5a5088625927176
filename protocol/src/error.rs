//! Errors of the protocol layer: malformed frames and malformed commands.

use std::fmt;

use bytes::Bytes;

/// A frame could not be decoded.
///
/// Either kind ends the connection: after a malformed frame the byte stream
/// can no longer be trusted, and an oversized frame is not read to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The bytes do not follow RESP.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A length announced by the frame is over its limit.
    #[error("{what} of {len} is over the limit of {limit}")]
    TooBig {
        /// What was too big (e.g. `"bulk length"`).
        what: &'static str,
        /// The announced length.
        len: u64,
        /// The limit in force.
        limit: u64,
    },
}

/// A well-formed frame is not a valid command.
///
/// These are answered with an `-ERR` (or `-TOOBIG`) reply and the connection
/// stays open. Nothing here allocates a message string: the text is built
/// when the error is displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandError {
    /// The frame is not an array of bulk strings.
    NotAnArray,
    /// The request was an empty array.
    Empty,
    /// No command has this name.
    Unknown(Bytes),
    /// The command was given the wrong number of arguments.
    WrongArity(&'static str),
    /// A number argument is not a valid integer in its range.
    NotAnInteger(&'static str),
    /// An option keyword is not known to the command.
    UnknownOption {
        /// The command.
        command: &'static str,
        /// The option as sent.
        option: Bytes,
    },
    /// An option was given twice.
    DuplicateOption(&'static str),
    /// An option keyword was the last argument, without its value.
    MissingValue(&'static str),
    /// A value is not one of the accepted words.
    BadValue {
        /// The option or argument.
        what: &'static str,
        /// The words accepted.
        expected: &'static str,
    },
    /// An unknown subcommand.
    UnknownSubcommand {
        /// The command.
        command: &'static str,
        /// The subcommand as sent.
        sub: Bytes,
    },
    /// A generic syntax error with a fixed explanation.
    Syntax(&'static str),
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::NotAnArray => {
                f.write_str("protocol error: expected an array of bulk strings")
            }
            CommandError::Empty => f.write_str("empty command"),
            CommandError::Unknown(name) => {
                write!(f, "unknown command '{}'", Printable(name))
            }
            CommandError::WrongArity(cmd) => {
                write!(f, "wrong number of arguments for '{cmd}' command")
            }
            CommandError::NotAnInteger(what) => {
                write!(f, "{what} is not an integer or out of range")
            }
            CommandError::UnknownOption { command, option } => {
                write!(f, "unknown option '{}' for '{command}'", Printable(option))
            }
            CommandError::DuplicateOption(opt) => write!(f, "option {opt} given more than once"),
            CommandError::MissingValue(opt) => write!(f, "option {opt} needs a value"),
            CommandError::BadValue { what, expected } => {
                write!(f, "{what} must be one of {expected}")
            }
            CommandError::UnknownSubcommand { command, sub } => {
                write!(f, "unknown subcommand '{}' for '{command}'", Printable(sub))
            }
            CommandError::Syntax(msg) => write!(f, "syntax error: {msg}"),
        }
    }
}

impl std::error::Error for CommandError {}

/// Displays client-supplied bytes safely: at most 128 bytes, non-printable
/// bytes escaped, so that an error message can never smuggle a CRLF into a
/// simple-string reply.
pub(crate) struct Printable<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in self.0.iter().take(128) {
            if b.is_ascii_graphic() || b == b' ' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        if self.0.len() > 128 {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// A typed reply could not be read from a frame (client side).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected reply: {0}")]
pub struct ReplyError(pub &'static str);
