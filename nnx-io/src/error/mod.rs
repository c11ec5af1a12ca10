//! nnx's one error and the problem types its variants name, defined in nnx-core so that every
//! crate of nnx returns the same [`Error`].

pub use nnx_core::error::*;
