//! A task that ends with its owner.

/// Aborts its task when dropped: a watch, a sweep or a reader started for something ends with
/// that thing (a run that ends or loses its lease, a server that stops, a caller that leaves).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
