//! A raw RESP connection for load generation.

use std::io;

use bytes::BytesMut;
use idem_protocol::{Frame, Limits, decode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Appends a request (an array of bulk strings) to `out`.
pub fn encode(out: &mut BytesMut, args: &[&[u8]]) {
    let mut num = itoa_buf(args.len());
    out.extend_from_slice(b"*");
    out.extend_from_slice(num.as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        num = itoa_buf(a.len());
        out.extend_from_slice(b"$");
        out.extend_from_slice(num.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn itoa_buf(n: usize) -> String {
    n.to_string()
}

/// A connection to Idem or Redis.
pub struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    /// Requests to send.
    pub out: BytesMut,
    limits: Limits,
}

impl Conn {
    /// Connects with TCP_NODELAY.
    pub async fn connect(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            out: BytesMut::with_capacity(64 * 1024),
            limits: Limits::for_replies(),
        })
    }

    /// Appends a request to the send buffer.
    pub fn push(&mut self, args: &[&[u8]]) {
        encode(&mut self.out, args);
    }

    /// Writes the send buffer.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.out).await?;
        self.out.clear();
        Ok(())
    }

    /// Reads one reply.
    pub async fn read(&mut self) -> io::Result<Frame> {
        loop {
            match decode(&mut self.rbuf, &self.limits) {
                Ok(Some(f)) => return Ok(f),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
        }
    }

    /// Sends one request and reads its reply.
    pub async fn call(&mut self, args: &[&[u8]]) -> io::Result<Frame> {
        self.push(args);
        self.flush().await?;
        self.read().await
    }
}

/// Reads a numeric field of an INFO reply.
pub fn info_field(info: &Frame, field: &str) -> Option<u64> {
    let Frame::Bulk(text) = info else { return None };
    let text = std::str::from_utf8(text).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .parse()
            .ok()
    })
}
