//! A tracing writer that keeps everything written to it in memory.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// A `MakeWriter` that appends every log line to a shared buffer.
#[derive(Clone, Default, Debug)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        match self.0.lock() {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(poisoned) => String::from_utf8_lossy(&poisoned.into_inner()).into_owned(),
        }
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("capture lock"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A subscriber logging everything (TRACE, all targets) into `capture`.
pub fn capturing_subscriber(capture: &Capture) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(capture.clone())
        .finish()
}

/// Installs a process-wide subscriber at `filter` (an `EnvFilter` directive) that writes into
/// a new capture, and returns the capture.
pub fn capture_globally(filter: &str) -> Capture {
    let capture = Capture::default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(false)
        .with_writer(capture.clone())
        .init();
    capture
}
