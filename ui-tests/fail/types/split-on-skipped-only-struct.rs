//! `split` on a field whose struct skips all its fields, so holds no tensors.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Config {
    #[nnx(skip)]
    heads: usize,
}

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 2, index = 0))]
    q: Tensor,
    #[nnx(from = "c_attn", split(axis = -1, parts = 2, index = 1))]
    config: Config,
}

fn main() {}
