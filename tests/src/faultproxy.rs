//! A TCP proxy on loopback that forwards to a target and injects network faults: added
//! latency, stalls (connections stay open, no byte moves) and cuts (every connection closed,
//! new ones refused). TLS and HTTP/2 pass through untouched: it moves bytes.

use std::{io, net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};
use tokio_util::sync::CancellationToken;

/// The fault in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Bytes flow.
    None,
    /// Every chunk of bytes waits this long before it is forwarded.
    Latency(Duration),
    /// No byte moves in either direction; connections stay open.
    Stall,
    /// Open connections are closed, new ones closed at once.
    Cut,
}

/// A running proxy; stopped when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    fault: watch::Sender<Fault>,
    target: watch::Sender<SocketAddr>,
    cancel: CancellationToken,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, fault_rx) = watch::channel(Fault::None);
        let (target, target_rx) = watch::channel(target);
        let cancel = CancellationToken::new();
        tokio::spawn(accept(listener, fault_rx, target_rx, cancel.clone()));
        Ok(Self {
            addr,
            fault,
            target,
            cancel,
        })
    }

    /// Puts `fault` in force (replacing the one before).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Forwards new connections to `target` from now on.
    pub fn retarget(&self, target: SocketAddr) {
        self.target.send_replace(target);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept(
    listener: TcpListener,
    fault: watch::Receiver<Fault>,
    target: watch::Receiver<SocketAddr>,
    cancel: CancellationToken,
) {
    loop {
        let (inbound, _) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
        };
        if *fault.borrow() == Fault::Cut {
            drop(inbound);
            continue;
        }
        let (fault, to, cancel) = (fault.clone(), *target.borrow(), cancel.clone());
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(to).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            // Either direction ending (or a cut) ends both.
            tokio::select! {
                () = cancel.cancelled() => {}
                () = pump(ri, wo, fault.clone()) => {}
                () = pump(ro, wi, fault) => {}
            }
        });
    }
}

/// Copies bytes from `from` to `to`, applying the fault in force to each chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // While stalled nothing is read; a cut ends the connection at once.
        loop {
            match *fault.borrow_and_update() {
                Fault::Cut => return,
                Fault::Stall => {}
                Fault::None | Fault::Latency(_) => break,
            }
            if fault.changed().await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = fault.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let current = *fault.borrow();
        match current {
            Fault::Cut => return,
            Fault::Latency(d) => tokio::time::sleep(d).await,
            Fault::Stall => {
                // Hold the chunk until the stall ends.
                while *fault.borrow_and_update() == Fault::Stall {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
                if *fault.borrow() == Fault::Cut {
                    return;
                }
            }
            Fault::None => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn forwards_and_injects_each_fault() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");

        proxy.set(Fault::Latency(Duration::from_millis(100)));
        let begin = tokio::time::Instant::now();
        round_trip(&mut s).await.unwrap();
        assert!(
            begin.elapsed() >= Duration::from_millis(200),
            "both directions delayed"
        );

        proxy.set(Fault::Stall);
        let stalled = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut s)).await;
        assert!(stalled.is_err(), "nothing moves while stalled");
        proxy.set(Fault::None);
        // The bytes held during the stall arrive now.
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        proxy.set(Fault::Cut);
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "open connection closed"
        );
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(
            round_trip(&mut fresh).await.is_err(),
            "new connections refused"
        );

        proxy.set(Fault::None);
        let mut again = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut again).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn retargets_new_connections() {
        let proxy = FaultProxy::start("127.0.0.1:9".parse().unwrap())
            .await
            .unwrap();
        proxy.retarget(echo_server().await);
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");
    }
}
