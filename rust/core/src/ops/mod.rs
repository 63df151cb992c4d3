//! Shared building blocks of the forward passes: matmul, norms, rope, attention,
//! activations.
pub mod matmul;
pub mod sgemm;
pub mod act;
pub mod attention;
pub mod attention_tiled;
pub(crate) mod attention_f16;
pub mod norm;
pub mod rope;
pub mod vec;
pub mod ssm;
