//! nnx-io: SafeTensors archives. Files are memory-mapped and their tensors point into the
//! mapped pages; loads are strict within a prefix and validated from headers before any
//! tensor byte is read; saves are atomic and deterministic, optionally page-aligned or
//! sharded. PyTorch checkpoints open as archives too, read by a restricted unpickler that
//! executes nothing.
//!
//! Users depend on the `nnx` facade crate, which re-exports everything here.

mod archive;
pub mod config;
mod error;
pub mod fs;
mod header;
pub mod hub;
mod import;
mod index;
mod mapped;
pub mod quantized;
#[cfg(feature = "remote")]
pub mod remote;
pub mod sniff;
pub mod text;
mod torch;
mod write;

pub use archive::{Archive, EntryInfo, EntryLocation};
pub use error::{
    ConfigProblem, ConfigRule, Error, ExportProblem, HubProblem, IndexProblem, PickleLimit, PickleProblem,
    RemoteProblem, Result, ShardProblem, TorchProblem, UnsavableProblem, ZipRecordProblem,
};
pub use header::HeaderProblem;
pub use import::{
    HookContext, ImportError, ImportHook, ImportOptions, ImportPlan, ImportProblem, ImportReport, TensorParallel,
};
pub use sniff::FileKind;
pub use write::{PAGE_BYTES, SaveOptions};
