//! Integration tests of the public API, one module per capability.

mod archive;
mod cli;
mod convert;
mod crash;
mod generate;
mod gpu;
mod gpu_zero_copy;
mod hostile;
mod hostile_readers;
mod hub;
mod hub_python;
mod hub_server;
mod import;
mod load_errors;
mod minilm;
mod models;
mod pretrained;
mod python;
mod quant_affine;
mod quant_cli;
mod quant_seed;
mod snapshots;
mod state;
mod tensor;
mod torch;
mod util;
