//! Diagnostics the core reports while it runs (the GPU backend's notes: which layers or
//! caches stay on the CPU and why), one line each. They go to the sink the embedding sets
//! (the Python extension sets one that logs to the `pyllama` logger, so `logging` and
//! `llama_log_set` see them), and to stderr when none is set.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

static SINK: OnceLock<fn(Level, &str)> = OnceLock::new();

/// Set where diagnostics go (once per process; later calls are ignored).
pub fn set_sink(f: fn(Level, &str)) {
    let _ = SINK.set(f);
}

/// Report one line.
pub fn log(level: Level, msg: &str) {
    match SINK.get() {
        Some(f) => f(level, msg),
        None => eprintln!("pyllama: {msg}"),
    }
}

pub fn warn(msg: &str) {
    log(Level::Warn, msg);
}
