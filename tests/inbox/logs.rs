//! What a test's code logs, as text.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// The lines a subscriber writes, kept in memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `work`'s output and what it logged at info and above, on this thread (run it on a
/// current-thread runtime, so that all of it runs here).
pub async fn logged<F: Future>(work: F) -> (F::Output, String) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let output = {
        let _guard = tracing::subscriber::set_default(subscriber);
        work.await
    };
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (output, text)
}
