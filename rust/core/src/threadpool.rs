//! Persistent worker threads with a cheap barrier.
