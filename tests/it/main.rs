//! Integration tests of the public API, one module per capability.

mod archive;
mod hostile;
mod import;
mod models;
mod python;
mod snapshots;
mod state;
mod tensor;
mod util;
