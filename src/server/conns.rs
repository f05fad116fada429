//! The server's connections, bounded so that one client cannot exhaust them: a connection must
//! send its first request's headers within [`HEADER_READ`], one that reads and writes nothing for
//! [`IDLE`] is closed, and at most [`MAX_CONNECTIONS`] are kept open; a new connection past that
//! closes the one that has been quiet (nothing read or written) the longest. Half-sent requests therefore cannot use up the process's file
//! descriptors and lock out a client that sends a whole request at once.
//!
//! It works on the byte stream under axum's HTTP server (a [`Listener`] whose connections are
//! wrapped), so it knows no request but the first one's end of headers. Deliberately not here:
//! who the caller is (`auth`), per-principal limits, and anything about runs.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How long a new connection has to send its first request's headers.
pub const HEADER_READ: Duration = Duration::from_secs(10);

/// How long a connection may read and write nothing before it is closed: longer than the
/// longest `wait` (300 s), and event streams send a keep-alive comment every 15 s.
pub const IDLE: Duration = Duration::from_secs(330);

/// Connections kept open at most (well under the usual 1024 file descriptors of a process).
pub const MAX_CONNECTIONS: usize = 512;

/// One open connection, as the registry sees it.
struct Conn {
    /// Set when the registry closed it (to make room); its next read or write fails.
    closed: AtomicBool,
    /// The last time it read or wrote, as a tick of the registry's clock.
    active: AtomicU64,
    /// The task waiting on it, woken when it is closed.
    waker: Mutex<Option<Waker>>,
}

/// The open connections by when they were last active.
#[derive(Default)]
struct Registry {
    tick: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a new connection, closing the quietest ones past `max`.
    fn open(&self, max: usize) -> (u64, Arc<Conn>) {
        let id = self.now();
        let conn = Arc::new(Conn {
            closed: AtomicBool::new(false),
            active: AtomicU64::new(id),
            waker: Mutex::new(None),
        });
        let mut open = match self.open.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        open.insert(id, conn.clone());
        while open.len() > max {
            let quietest = open
                .iter()
                .min_by_key(|(_, c)| c.active.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            let Some(k) = quietest else { break };
            if let Some(c) = open.remove(&k) {
                c.closed.store(true, Ordering::Relaxed);
                let w = c.waker.lock().ok().and_then(|mut w| w.take());
                if let Some(w) = w {
                    w.wake();
                }
            }
        }
        (id, conn)
    }

    fn close(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&id);
        }
    }
}

/// The server's listener: TCP with `TCP_NODELAY` (events are small writes that must leave at
/// once), each connection bounded as the module says.
pub(super) struct Bounded {
    tcp: TcpListener,
    registry: Arc<Registry>,
    max: usize,
}

impl Bounded {
    pub(super) fn new(tcp: TcpListener) -> Bounded {
        Bounded {
            tcp,
            registry: Arc::default(),
            max: MAX_CONNECTIONS,
        }
    }
}

impl Listener for Bounded {
    type Io = BoundedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedIo, SocketAddr) {
        let (tcp, addr) = Listener::accept(&mut self.tcp).await;
        let _ = tcp.set_nodelay(true);
        let (id, conn) = self.registry.open(self.max);
        let io = BoundedIo {
            tcp,
            id,
            conn,
            registry: self.registry.clone(),
            headers: Some((Box::pin(tokio::time::sleep(HEADER_READ)), 0)),
            idle: Box::pin(tokio::time::sleep(IDLE)),
        };
        (io, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A connection under the registry's bounds.
pub(super) struct BoundedIo {
    tcp: TcpStream,
    id: u64,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    /// Until the first request's headers ended: the deadline, and how much of `\r\n\r\n` the
    /// last bytes read matched.
    headers: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    /// When the connection counts as idle unless it reads or writes before.
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl BoundedIo {
    /// Fails once the registry closed the connection or its headers came too late; else
    /// remembers the task to wake.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Ok(mut w) = self.conn.waker.lock() {
            *w = Some(cx.waker().clone());
        }
        if self.conn.closed.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for other connections",
            ));
        }
        if let Some((deadline, _)) = &mut self.headers
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request's headers did not come in time",
            ));
        }
        if self.idle.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection read and wrote nothing for too long",
            ));
        }
        Ok(())
    }

    fn touch(&mut self) {
        self.conn
            .active
            .store(self.registry.now(), Ordering::Relaxed);
        self.idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
    }
}

impl Drop for BoundedIo {
    fn drop(&mut self) {
        self.registry.close(self.id);
    }
}

impl AsyncRead for BoundedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        me.check(cx)?;
        let before = buf.filled().len();
        let r = Pin::new(&mut me.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let got = &buf.filled()[before..];
            if !got.is_empty() {
                me.touch();
            }
            if let Some((_, matched)) = &mut me.headers {
                for b in got {
                    *matched = match (*matched, b) {
                        (0 | 2, b'\r') => *matched + 1,
                        (1 | 3, b'\n') => *matched + 1,
                        (_, b'\r') => 1,
                        _ => 0,
                    };
                    if *matched == 4 {
                        break;
                    }
                }
                if *matched == 4 {
                    me.headers = None;
                }
            }
        }
        r
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.conn.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for other connections",
            )));
        }
        let r = Pin::new(&mut me.tcp).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            me.touch();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn headers_that_do_not_come_in_time_close_the_connection() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut l = Bounded::new(tcp);
        // Half a request, then nothing: the read fails at the deadline.
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        let (mut io, _) = Listener::accept(&mut l).await;
        let mut buf = vec![0u8; 1024];
        let mut got = 0;
        let err = loop {
            match io.read(&mut buf[got..]).await {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // A whole request's headers: no deadline after them.
        let mut quick = TcpStream::connect(addr).await.expect("connect");
        quick
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let (mut io, _) = Listener::accept(&mut l).await;
        let n = io.read(&mut buf).await.expect("read");
        assert!(n > 0 && io.headers.is_none());
        tokio::time::sleep(HEADER_READ * 2).await;
        quick.write_all(b"x").await.expect("write");
        assert_eq!(io.read(&mut buf).await.expect("read"), 1);
    }

    /// A connection that sent a whole request and then reads and writes nothing is closed after
    /// [`IDLE`]; one that keeps writing is not.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut l = Bounded::new(tcp);
        let mut quiet = TcpStream::connect(addr).await.expect("connect");
        quiet
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let (mut io, _) = Listener::accept(&mut l).await;
        let mut buf = vec![0u8; 1024];
        assert!(io.read(&mut buf).await.expect("read") > 0);
        // Written to within the idle time, again and again: still open well past it.
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            tokio::time::sleep(IDLE / 2).await;
            io.write_all(b": keep-alive\n").await.expect("write");
        }
        assert!(start.elapsed() > IDLE);
        // Then nothing: the next read fails once the idle time has passed.
        let quiet_since = tokio::time::Instant::now();
        let err = tokio::time::timeout(IDLE * 2, io.read(&mut buf))
            .await
            .expect("closed within twice the idle time")
            .expect_err("closed");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(quiet_since.elapsed() >= IDLE, "{:?}", quiet_since.elapsed());
        drop(quiet);
    }

    #[test]
    fn the_quietest_connection_makes_room() {
        let r = Registry::default();
        let (a, ca) = r.open(2);
        let (_b, cb) = r.open(2);
        // `a` was active after `b` opened: `b` is the quietest.
        ca.active.store(r.now(), Ordering::Relaxed);
        let (_c, cc) = r.open(2);
        assert!(cb.closed.load(Ordering::Relaxed));
        assert!(!ca.closed.load(Ordering::Relaxed) && !cc.closed.load(Ordering::Relaxed));
        r.close(a);
        assert_eq!(r.open.lock().map(|o| o.len()).unwrap_or(0), 1);
    }
}
