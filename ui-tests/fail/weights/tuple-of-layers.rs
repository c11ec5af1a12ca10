// A tuple of projections: `map_weights` has no converted value to build for it.
use nnx::models::{Dense, Weights};
use nnx::{Device, Host, Module};

#[derive(Module, Clone, Debug)]
struct Pair<D: Device = Host, W: Weights = Dense> {
    pair: (W::Layer<D>, W::Layer<D>),
}

fn main() {}
