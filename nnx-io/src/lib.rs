//! nnx-io: SafeTensors archives. Files are memory-mapped and their tensors point into the
//! mapped pages; loads are strict within a prefix and validated from headers before any
//! tensor byte is read; saves are atomic and deterministic, optionally page-aligned or
//! sharded. PyTorch checkpoints open as archives too, read by a restricted unpickler that
//! executes nothing.
//!
//! Users depend on the `nnx` facade crate, which re-exports everything here.

pub mod adapter;
mod archive;
mod budget;
pub mod config;
pub mod dcp;
mod error;
mod format;
pub mod fs;
pub mod gguf;
pub mod hub;
mod import;
mod mapping;
mod orbax;
pub mod plan;
pub mod published;
pub mod quantized;
#[cfg(feature = "remote")]
pub mod remote;
mod safetensors;
pub mod sniff;
mod source;
pub mod stats;
/// Printing outside text safely: control characters escaped, URLs without credentials.
pub use nnx_core::text;
mod torch;

pub use archive::{Archive, EntryInfo, EntryLocation};
pub use error::{
    ConfigProblem, ConfigRule, Error, ExportProblem, HubProblem, IndexProblem, PickleLimit, PickleProblem,
    RemoteProblem, Result, ShardProblem, TorchProblem, UnsavableProblem, ZipRecordProblem,
};
pub use import::{
    HookContext, ImportError, ImportHook, ImportOptions, ImportPlan, ImportProblem, ImportReport, PlanRow,
    TensorParallel,
};
pub use safetensors::header::HeaderProblem;
pub use safetensors::write::{PAGE_BYTES, SaveOptions};
pub use sniff::FileKind;
