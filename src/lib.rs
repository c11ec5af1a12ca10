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
//!     fc1: Linear::builder(4, 8).init(Init::Seeded(0).at("fc1")).build(),
//!     fc2: Linear::builder(8, 2).dtype(DType::F32).init(Init::Seeded(0).at("fc2")).build(),
//!     hidden: 8,
//! };
//! let keys: Vec<_> = mlp.flat_state_dict().keys().map(str::to_string).collect();
//! assert_eq!(keys, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! ```

// The derive names `::nnx::...`; this lets the models below use it inside this crate.
#[cfg(feature = "kernels")]
extern crate self as nnx;

#[cfg(feature = "kernels")]
pub mod generate;
#[cfg(feature = "kernels")]
pub mod models;
#[cfg(feature = "kernels")]
mod pretrained;

pub use nnx_derive::Module;

// Tensors.
/// The kernels every device runs: model code generic over `Tensor<D>: Compute` is written once.
#[cfg(feature = "kernels")]
pub use nnx_core::Compute;
/// The GPU device: one wgpu adapter.
#[cfg(feature = "gpu")]
pub use nnx_core::Gpu;
pub use nnx_core::{DType, Device, Element, Host, OnDevice, Place, Placement, Placer, Tensor};

// Modules: the trait, its walk, and what the walk reports.
pub use nnx_core::{
    FieldInfo, ImportOp, ImportRule, Module, Naming, PathStep, Split, TensorSlot, Visitor, VisitorMut, for_each_entry,
    for_each_entry_mut, for_each_entry_named,
};

// State dicts and loads.
pub use nnx_core::{
    FlatStateDict, LoadOptions, LoadReport, StateDict, StateNode, TensorSpec, describe_import, key_table, module_specs,
};

// Pretrained folders: `config.json`, weights and a model card, saved and loaded as a whole.
#[cfg(feature = "kernels")]
pub use pretrained::{Pretrained, PretrainedOptions};

// Layers and quantized encodings.
pub use nnx_core::{nn, parallel, quant};

// Archives, saves and imports.
/// LoRA adapters (PEFT, MLX-LM, GGUF) read and merged into derived modules.
pub use nnx_io::adapter;
/// Configuration files read with a size limit.
pub use nnx_io::config;
pub use nnx_io::dcp;
pub use nnx_io::gguf;
pub use nnx_io::hub;
/// Checkpoints published quantized (FP8, NVFP4, MXFP4, INT4, GPTQ, AWQ) read as float weights.
pub use nnx_io::plan;
pub use nnx_io::published;
/// Archives in object stores and on the Hub: [`Archive::open`] takes their URLs.
#[cfg(feature = "remote")]
pub use nnx_io::remote;
/// Per-tensor statistics (`nnx stats`), accumulated in f64 over streamed chunks.
pub use nnx_io::stats;
/// Printing outside text safely: control characters escaped, URLs without credentials.
pub use nnx_io::text;
pub use nnx_io::{
    Archive, EntryInfo, EntryLocation, HookContext, ImportHook, ImportOptions, ImportPlan, ImportReport, PAGE_BYTES,
    PlanRow, SaveOptions, TensorParallel, quantized, sniff,
};

/// The error of every nnx operation, from a tensor operation to a Hub download.
pub use nnx_core::Error;
/// `Result` with [`Error`].
pub use nnx_core::Result;

/// The problem types [`Error`]'s variants name, for programs that match on them.
pub mod error {
    pub use nnx_core::UnknownDType;
    pub use nnx_core::error::*;
    pub use nnx_io::{ImportError, ImportProblem};
}

#[doc(hidden)]
pub use nnx_core::__private;

// The README's code runs as a doctest, so what it shows compiles and works.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The names most programs need: `use nnx::prelude::*;`.
pub mod prelude {
    pub use crate::nn::{Embedding, Init, LayerNorm, Linear, RmsNorm};
    pub use crate::{Archive, DType, FlatStateDict, LoadReport, Module, StateDict, Tensor};
}
