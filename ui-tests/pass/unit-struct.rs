//! A unit struct, and a struct whose fields are all skipped, are modules with no tensors.

use nnx::Module;

#[derive(Module)]
struct Identity;

#[derive(Module)]
struct Config {
    #[nnx(skip)]
    width: usize,
}

#[derive(Module)]
struct Empty {}

fn main() {
    assert!(Identity.flat_state_dict().is_empty());
    let config = Config { width: 3 };
    assert_eq!(config.width, 3);
    assert!(config.flat_state_dict().is_empty());
    assert!(Empty {}.flat_state_dict().is_empty());
}
