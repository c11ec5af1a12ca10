//! A tour of nnx in one page: a model from plain structs, its state dict as a table, a partial
//! load with its report, a strict load that refuses a wrong shape, and a round trip through a
//! memory-mapped SafeTensors file.
//!
//! Run it with `cargo run -p nnx-quickstart`, which builds nnx without its default features
//! (kernels, models, command line), or with `cargo run --example quickstart`.

use nnx::nn::{Embedding, Init, LayerNorm, Linear};
use nnx::{Archive, DType, FlatStateDict, Module, Tensor, key_table};

/// One transformer-style block: named fields become path segments.
#[derive(Module)]
struct Block {
    norm: LayerNorm,
    up: Linear,
    down: Linear,
}

/// A tiny model: a `Vec` of blocks is numbered (`blocks.0`, `blocks.1`), an `Option` adds
/// nothing to the path, and `skip` keeps configuration out of the state.
#[derive(Module)]
struct TinyModel {
    embed: Embedding,
    blocks: Vec<Block>,
    head: Option<Linear>,
    #[nnx(skip)]
    width: usize,
}

impl TinyModel {
    fn new(vocab: usize, width: usize, layers: usize, init: Init) -> TinyModel {
        TinyModel {
            embed: Embedding::builder(vocab, width).init(init.at("embed")).build(),
            blocks: (0..layers)
                .map(|layer| {
                    let init = init.at(&format!("blocks.{layer}"));
                    Block {
                        norm: LayerNorm::builder(width).init(init.at("norm")).build(),
                        up: Linear::builder(width, 4 * width).init(init.at("up")).build(),
                        down: Linear::builder(4 * width, width).init(init.at("down")).build(),
                    }
                })
                .collect(),
            head: Some(Linear::builder(width, vocab).bias(false).init(init.at("head")).build()),
            width,
        }
    }
}

fn main() -> nnx::Result<()> {
    let model = TinyModel::new(100, 8, 2, Init::Seeded(42));
    println!("# The model's state dict ({} wide), in walk order\n", model.width);
    print!("{}", key_table(&model));

    // Partial load: only the first block comes from a "pretrained" source.
    let pretrained = TinyModel::new(100, 8, 2, Init::Seeded(7));
    let mut subset: FlatStateDict = pretrained.flat_state_dict().with_prefix("blocks.0");
    subset.insert("blocks.0.adapter.weight", Tensor::zeros(DType::F32, &[8, 8]));
    let mut fine_tuned = TinyModel::new(100, 8, 2, Init::Seeded(42));
    let report = fine_tuned.load_flat_state_dict(&subset)?;
    println!("\n# Partial load of `blocks.0`");
    println!("loaded:     {}", report.loaded.join(", "));
    println!("missing:    {} keys kept their values ({} ...)", report.missing.len(), report.missing[0]);
    println!("unexpected: {}", report.unexpected.join(", "));

    // Strict load: a checkpoint with a larger vocabulary and a misspelt key is refused, every
    // problem listed, before anything changes.
    let mut strict_target = TinyModel::new(100, 8, 2, Init::Zeros);
    let mut dict = TinyModel::new(100, 8, 2, Init::Seeded(1)).flat_state_dict();
    dict.insert("head.weight", Tensor::zeros(DType::F32, &[120, 8]));
    let up = dict.remove("blocks.1.up.weight").expect("the model has this key");
    dict.insert("blocks.1.up.weights", up);
    let error = strict_target.load_flat_state_dict_strict(&dict).expect_err("the checkpoint does not fit");
    println!("\n# Strict load of a checkpoint that does not fit\n{error}");
    let untouched = strict_target.head.as_ref().map(|head| head.weight.shape().to_vec());
    println!("the model is unchanged: head.weight is still {untouched:?}");

    // Archives: save atomically, open by mapping, load into a meta model (no allocation).
    let path = std::env::temp_dir().join(format!("nnx-quickstart-{}.safetensors", std::process::id()));
    Archive::from_module(&model, "model").save(&path)?;
    let archive = Archive::open(&path)?;
    let mut restored = TinyModel::new(100, 8, 2, Init::Meta);
    archive.load_into(&mut restored, "model")?;
    let mapped = restored.flat_state_dict().iter().filter(|(_, tensor)| tensor.is_mapped()).count();
    println!("\n# Saved to and loaded back from {}", path.display());
    println!("{} entries; {mapped} tensors are views of the mapped file", archive.len());
    let same = restored.embed.weight.to_vec::<f32>()? == model.embed.weight.to_vec::<f32>()?;
    println!("embedding round-trips exactly: {same}");
    std::fs::remove_file(&path).map_err(|source| nnx::Error::Io { action: "remove", path: path.clone(), source })?;
    Ok(())
}
