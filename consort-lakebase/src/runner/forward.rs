//! The one way out of a run's own network: its branch.
//!
//! A confined process listens at its branch's address inside its network namespace and hands
//! the listener to Consort ([`super::namespaces`]). Consort accepts there, outside the run, and
//! joins each connection to the branch's real address; it forwards bytes and nothing else, so
//! what the run reaches through it is the branch's server with the branch's credentials, as a
//! direct connection would. The forwarding ends when the run's process does (the guard is
//! dropped), and with it every connection it carries.

use std::net::TcpListener as StdListener;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tracing::debug;

/// Forwarding for one process of a run; stops when dropped.
#[derive(Debug)]
pub(crate) struct Forwarder {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Forwarder {
    /// Accepts on each of `listeners` (in the run's network) and forwards every connection to
    /// `host:port` (the branch, from this process's network).
    pub(crate) fn start(
        listeners: Vec<StdListener>,
        host: String,
        port: u16,
    ) -> std::io::Result<Forwarder> {
        let mut accepting = Vec::with_capacity(listeners.len());
        for l in listeners {
            l.set_nonblocking(true)?;
            accepting.push(TcpListener::from_std(l)?);
        }
        let task = tokio::spawn(async move {
            let mut acceptors = JoinSet::new();
            for listener in accepting {
                acceptors.spawn(accept_loop(listener, host.clone(), port));
            }
            while acceptors.join_next().await.is_some() {}
        });
        Ok(Forwarder { task })
    }
}

/// Accepts connections until the listener fails, each joined to the branch on a task of its
/// own; aborting this task aborts them all.
async fn accept_loop(listener: TcpListener, host: String, port: u16) {
    let mut joined = JoinSet::new();
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            return;
        };
        let host = host.clone();
        joined.spawn(async move {
            if let Err(e) = join(inbound, &host, port).await {
                debug!(error = %e, "a forwarded branch connection ended");
            }
        });
        // Reap what has ended, so a long run does not keep every finished connection.
        while joined.try_join_next().is_some() {}
    }
}

async fn join(mut inbound: TcpStream, host: &str, port: u16) -> std::io::Result<()> {
    let mut outbound = TcpStream::connect((host, port)).await?;
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
    Ok(())
}
