//! Shared building blocks of the forward passes: matmul, norms, rope, attention,
//! activations.
pub mod matmul;
