//! Snapshots of rendered key lists: name, dtype, shape and the recorded import rule.

use nnx::key_table;
use nnx::nn::Init;

use nnx::DType;
use nnx::models::gpt2::{Block, Gpt2, Gpt2Config};

use crate::models::{AdamState, Containers, Mlp, Pair};

fn tiny_gpt2() -> Gpt2Config {
    Gpt2Config {
        vocab_size: 32,
        n_positions: 16,
        n_embd: 8,
        n_layer: 1,
        n_head: 2,
        n_inner: None,
        layer_norm_epsilon: 1e-5,
        extra: serde_json::Map::new(),
    }
}

#[test]
fn mlp_keys() {
    let mlp = Mlp::new(4, 16, 2, Init::Meta);
    assert_eq!(mlp.hidden, 16, "skipped fields are configuration");
    insta::assert_snapshot!(key_table(&mlp));
}

#[test]
fn gpt2_block_keys_carry_their_import_rules() {
    let model = Gpt2::new(&tiny_gpt2(), DType::F32, Init::Meta);
    let block: &Block = &model.h[0];
    insta::assert_snapshot!(key_table(block));
}

#[test]
fn gpt2_keys_with_a_tied_head() {
    insta::assert_snapshot!(key_table(&Gpt2::new(&tiny_gpt2(), DType::F32, Init::Meta)));
}

#[test]
fn containers_and_tuple_structs() {
    insta::assert_snapshot!(key_table(&Containers::new(Init::Meta)));
    let pair = Pair(
        nnx::nn::Linear::builder(2, 2).init(Init::Meta).build(),
        nnx::nn::Linear::builder(2, 1).bias(false).init(Init::Meta).build(),
    );
    insta::assert_snapshot!(key_table(&pair), @r"
    name           dtype  shape
    0.weight       F32    [2, 2]
    0.bias         F32    [2]
    second.weight  F32    [1, 2]
    ");
}

#[test]
fn optimizer_state_of_an_mlp() {
    let state = AdamState {
        mu: Mlp::new(4, 16, 2, Init::Meta),
        nu: Mlp::new(4, 16, 2, Init::Meta),
        step: nnx::Tensor::meta(nnx::DType::I64, &[]),
    };
    insta::assert_snapshot!(key_table(&state));
}
