//! A named struct using every field attribute; the walk reports what each one records.

use nnx::nn::{Embedding, Init, Linear};
use nnx::{DType, ImportOp, Module, Split, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 0), transpose)]
    q: Linear,
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 1))]
    #[nnx(transpose)]
    k: Linear,
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 2), transpose)]
    v: Linear,
    #[nnx(rename = "out", from = "c_proj.inner")]
    projection: Linear,
    #[nnx(skip)]
    heads: usize,
}

#[derive(Module)]
struct Model {
    wte: Embedding,
    attn: Attention,
    #[nnx(tie = "wte")]
    head: Linear,
    #[nnx(optional, dtype = "BOOL")]
    mask: Tensor,
    #[nnx(dtype = "u32", rename = "ids")]
    positions: Tensor,
}

fn linear(seed: u64) -> Linear {
    Linear::builder(4, 4).bias(false).init(Init::Seeded(seed)).build()
}

fn main() {
    let model = Model {
        wte: Embedding::builder(8, 4).init(Init::Meta).build(),
        attn: Attention { q: linear(0), k: linear(1), v: linear(2), projection: linear(3), heads: 2 },
        head: Linear::builder(4, 8).bias(false).init(Init::Meta).build(),
        mask: Tensor::zeros(DType::Bool, &[4]),
        positions: Tensor::zeros(DType::U32, &[4]),
    };
    assert_eq!(model.attn.heads, 2);
    let mut entries = Vec::new();
    nnx::for_each_entry(&model, |entry, _| {
        entries.push((
            entry.name.to_string(),
            entry.source.to_string(),
            entry.ops.to_vec(),
            entry.tie.map(str::to_string),
            entry.optional,
            entry.dtype,
        ))
    });
    let split = |index| ImportOp::Split(Split { axis: -1, parts: 3, index });
    let expected = vec![
        ("wte.weight".to_string(), "wte.weight".to_string(), vec![], None, false, None),
        ("attn.q.weight".into(), "attn.c_attn.weight".into(), vec![split(0), ImportOp::Transpose], None, false, None),
        ("attn.k.weight".into(), "attn.c_attn.weight".into(), vec![split(1), ImportOp::Transpose], None, false, None),
        ("attn.v.weight".into(), "attn.c_attn.weight".into(), vec![split(2), ImportOp::Transpose], None, false, None),
        ("attn.out.weight".into(), "attn.c_proj.inner.weight".into(), vec![], None, false, None),
        ("head.weight".into(), "head.weight".into(), vec![], Some("wte.weight".to_string()), false, None),
        ("mask".into(), "mask".into(), vec![], None, true, Some(DType::Bool)),
        ("ids".into(), "ids".into(), vec![], None, false, Some(DType::U32)),
    ];
    assert_eq!(entries, expected);
}
