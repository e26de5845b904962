//! A process's hold on a feature in the shared store, kept while it drives the feature: a
//! thread renews the lease three times per lease time, and gives it up when the keeper is
//! dropped. A lease that cannot be renewed (it ran out while the process was paused or cut
//! off, and another took the feature over) is not taken back: the process's appends carry
//! its token and the store refuses them, so the lane ends without writing.

use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use consort_lakebase::store::{Lease, StoreHandle};

/// Holds a lease and renews it until dropped; then gives it up.
#[derive(Debug)]
pub struct LeaseKeeper {
    lease: Lease,
    store: Arc<StoreHandle>,
    stop: Option<Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

/// Who this process is, as the store records a lease's holder: the machine and the process.
pub fn holder_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "an unnamed machine".into());
    format!("{host} (PID {})", std::process::id())
}

impl LeaseKeeper {
    /// Keeps `lease`, renewing it for `ttl` every third of `ttl`.
    pub fn keep(store: Arc<StoreHandle>, lease: Lease, ttl: Duration) -> LeaseKeeper {
        let (stop, stopped) = channel::<()>();
        let (renewing, held) = (Arc::clone(&store), lease.clone());
        let renewer = std::thread::Builder::new()
            .name(format!("consort-lease-{}", lease.feature))
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(ttl / 3) {
                    match renewing.renew(&held, ttl) {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::error!(
                                feature = %held.feature,
                                "this process lost its hold on the feature (another may drive it now); it records nothing more"
                            );
                            return;
                        }
                        // A failed renewal is tried again: the lease lasts until its time.
                        Err(e) => tracing::warn!(
                            feature = %held.feature,
                            error = %consort_actors::error_chain(&e),
                            "the lease could not be renewed; trying again"
                        ),
                    }
                }
            })
            .map_err(|e| tracing::warn!(error = %e, "no thread renews the lease"))
            .ok();
        LeaseKeeper {
            lease,
            store,
            stop: Some(stop),
            renewer,
        }
    }

    /// The lease held.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether its thread still renews the lease: false once a renewal found the lease lost
    /// (a person's decision ended it, or it ran out and another took the feature over).
    pub fn renewing(&self) -> bool {
        self.renewer.as_ref().is_some_and(|r| !r.is_finished())
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        if let Err(e) = self.store.release(&self.lease) {
            tracing::warn!(
                feature = %self.lease.feature,
                error = %consort_actors::error_chain(&e),
                "the lease could not be given up; it runs out by itself"
            );
        }
    }
}
