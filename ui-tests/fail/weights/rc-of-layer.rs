// A container `map_weights` cannot map item by item (`Rc`): refused at the field.
use std::rc::Rc;

use nnx::models::{Dense, Weights};
use nnx::{Device, Host, Module};

#[derive(Module, Clone, Debug)]
struct Shared<D: Device = Host, W: Weights = Dense> {
    norm: nnx::nn::RmsNorm<D>,
    #[nnx(skip)]
    shared: Rc<W::Layer<Host>>,
}

fn main() {}
