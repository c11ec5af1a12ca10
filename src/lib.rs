//! nnx: neural-network weights for Rust.
//!
//! Write a model as plain structs, add `#[derive(Module)]`, and get a walk that names every
//! tensor by its path, state dicts with partial and strict loads, and SafeTensors archives that
//! map files instead of reading them.
//!
//! ```
//! use nnx::nn::{Init, Linear};
//! use nnx::{DType, Module};
//!
//! #[derive(Module)]
//! struct Mlp {
//!     fc1: Linear,
//!     fc2: Linear,
//!     #[nnx(skip)]
//!     hidden: usize,
//! }
//!
//! let mlp = Mlp {
//!     fc1: Linear::new(4, 8, true, DType::F32, Init::Seeded(0)),
//!     fc2: Linear::new(8, 2, true, DType::F32, Init::Seeded(1)),
//!     hidden: 8,
//! };
//! let keys: Vec<_> = mlp.flat_state_dict().keys().map(str::to_string).collect();
//! assert_eq!(keys, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! ```

// The derive names `::nnx::...`; this lets the models below use it inside this crate.
extern crate self as nnx;

pub mod models;

pub use nnx_core::*;
pub use nnx_derive::Module;
pub use nnx_io::*;

/// The error of tensor operations alone; [`Error`] wraps it, so `?` converts.
pub use nnx_core::Error as TensorError;
/// The error of every nnx operation: archives, loads, and tensor operations.
pub use nnx_io::Error;
/// `Result` with [`Error`].
pub use nnx_io::Result;

/// The names most programs need: `use nnx::prelude::*;`.
pub mod prelude {
    pub use crate::nn::{Embedding, Init, LayerNorm, Linear, RmsNorm};
    pub use crate::{Archive, DType, FlatStateDict, LoadReport, Module, StateDict, Tensor};
}
