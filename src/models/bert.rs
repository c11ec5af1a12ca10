//! BERT encoders as Hugging Face stores them (`embeddings.*`, `encoder.layer.N.attention.self.query`,
//! ...), with the sentence-embedding head of sentence-transformers: mean pooling over the
//! attention mask, then L2 normalisation. all-MiniLM-L6-v2 is one of these.

use std::path::Path;

use crate::nn::{Embedding, Init, LayerNorm, Linear};
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a BERT `config.json` that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](BertConfig::extra), so a configuration
/// read and written again ([`crate::Pretrained::save_pretrained`]) loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Width of the feed-forward network.
    pub intermediate_size: usize,
    /// Longest sequence (learned positions).
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    #[serde(default = "default_types")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_epsilon")]
    pub layer_norm_eps: f32,
    /// Every other field of the file (`model_type`, `hidden_act`, dropout rates, ...), as
    /// read: nnx does not use them and writes them back.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_types() -> usize {
    2
}

fn default_epsilon() -> f32 {
    1e-12
}

impl BertConfig {
    /// Reads a `config.json` and [checks](BertConfig::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<BertConfig> {
        super::read_config(path.as_ref(), BertConfig::check)
    }

    /// Checks that the configuration makes a model: every size at least 1,
    /// `num_attention_heads` dividing `hidden_size`, at most [`MAX_LAYERS`](super::MAX_LAYERS)
    /// layers, and weights small enough to address. `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        checks.positive("vocab_size", self.vocab_size)?;
        checks.positive("hidden_size", self.hidden_size)?;
        checks.positive("num_attention_heads", self.num_attention_heads)?;
        checks.divides("num_attention_heads", self.num_attention_heads, ("hidden_size", self.hidden_size))?;
        checks.positive("intermediate_size", self.intermediate_size)?;
        checks.positive("max_position_embeddings", self.max_position_embeddings)?;
        checks.positive("type_vocab_size", self.type_vocab_size)?;
        checks.at_most("num_hidden_layers", self.num_hidden_layers, super::MAX_LAYERS)?;
        let (hidden, inner) = (self.hidden_size, self.intermediate_size);
        checks.addressable(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", hidden),
                ("intermediate_size", inner),
                ("max_position_embeddings", self.max_position_embeddings),
                ("type_vocab_size", self.type_vocab_size),
            ],
            self.num_hidden_layers,
            &[&[4, hidden, hidden], &[2, hidden, inner], &[9, hidden], &[1, inner]],
            &[
                &[self.vocab_size, hidden],
                &[self.max_position_embeddings, hidden],
                &[self.type_vocab_size, hidden],
                &[2, hidden],
            ],
        )
    }
}

/// Token, position and token-type embeddings, summed and normalised.
#[derive(Module, Clone, Debug)]
pub struct Embeddings<D: Device = Host> {
    /// Token embeddings.
    #[nnx(from = "word_embeddings")]
    pub words: Embedding<D>,
    /// Position embeddings.
    #[nnx(from = "position_embeddings")]
    pub positions: Embedding<D>,
    /// Token-type (segment) embeddings.
    #[nnx(from = "token_type_embeddings")]
    pub token_types: Embedding<D>,
    /// Norm of the sum.
    #[nnx(from = "LayerNorm")]
    pub norm: LayerNorm<D>,
}

/// One post-norm encoder layer.
#[derive(Module, Clone, Debug)]
pub struct Layer<D: Device = Host> {
    /// Query projection.
    #[nnx(from = "attention.self.query")]
    pub q: Linear<D>,
    /// Key projection.
    #[nnx(from = "attention.self.key")]
    pub k: Linear<D>,
    /// Value projection.
    #[nnx(from = "attention.self.value")]
    pub v: Linear<D>,
    /// Attention output projection.
    #[nnx(from = "attention.output.dense")]
    pub attn_out: Linear<D>,
    /// Norm after attention.
    #[nnx(from = "attention.output.LayerNorm")]
    pub attn_norm: LayerNorm<D>,
    /// Feed-forward expansion.
    #[nnx(from = "intermediate.dense")]
    pub up: Linear<D>,
    /// Feed-forward projection back.
    #[nnx(from = "output.dense")]
    pub down: Linear<D>,
    /// Norm after the feed-forward network.
    #[nnx(from = "output.LayerNorm")]
    pub out_norm: LayerNorm<D>,
}

/// A BERT encoder (no pooler: sentence embeddings pool the hidden states).
#[derive(Module, Clone, Debug)]
pub struct Bert<D: Device = Host> {
    /// Embeddings.
    pub embeddings: Embeddings<D>,
    /// The layers.
    #[nnx(from = "encoder.layer")]
    pub layers: Vec<Layer<D>>,
    /// The configuration.
    #[nnx(skip)]
    pub config: BertConfig,
}

/// A batch of token ids padded to one length, with its attention mask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// `batch * seq` token ids, row-major.
    pub ids: Vec<u32>,
    /// `batch * seq` flags: `true` for real tokens, `false` for padding.
    pub mask: Vec<bool>,
    /// Number of sequences.
    pub batch: usize,
    /// Padded length.
    pub seq: usize,
}

impl Batch {
    /// Pads `sequences` with `pad_id` to the longest one.
    pub fn pad(sequences: &[Vec<u32>], pad_id: u32) -> Batch {
        let seq = sequences.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(sequences.len() * seq);
        let mut mask = Vec::with_capacity(sequences.len() * seq);
        for sequence in sequences {
            ids.extend(sequence.iter().copied().chain(std::iter::repeat(pad_id)).take(seq));
            mask.extend((0..seq).map(|at| at < sequence.len()));
        }
        Batch { ids, mask, batch: sequences.len(), seq }
    }
}

impl Bert {
    /// A model of `config`; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &BertConfig, dtype: DType, init: Init) -> Bert {
        let hidden = config.hidden_size;
        let norm = || LayerNorm::builder(hidden).eps(config.layer_norm_eps).dtype(dtype).init(init).build();
        let linear =
            |input: usize, output: usize, init: Init| Linear::builder(input, output).dtype(dtype).init(init).build();
        let embedding = |rows: usize, init: Init| Embedding::builder(rows, hidden).dtype(dtype).init(init).build();
        Bert {
            embeddings: Embeddings {
                words: embedding(config.vocab_size, init.at("embeddings.words")),
                positions: embedding(config.max_position_embeddings, init.at("embeddings.positions")),
                token_types: embedding(config.type_vocab_size, init.at("embeddings.token_types")),
                norm: norm(),
            },
            layers: (0..config.num_hidden_layers)
                .map(|layer| {
                    let init = init.at(&format!("layers.{layer}"));
                    Layer {
                        q: linear(hidden, hidden, init.at("q")),
                        k: linear(hidden, hidden, init.at("k")),
                        v: linear(hidden, hidden, init.at("v")),
                        attn_out: linear(hidden, hidden, init.at("attn_out")),
                        attn_norm: norm(),
                        up: linear(hidden, config.intermediate_size, init.at("up")),
                        down: linear(config.intermediate_size, hidden, init.at("down")),
                        out_norm: norm(),
                    }
                })
                .collect(),
            config: config.clone(),
        }
    }
}

impl<D: Device> Bert<D>
where
    Tensor<D>: Compute,
{
    /// The last hidden states, `[batch, seq, hidden]` in F32, on the model's device.
    ///
    /// # Errors
    /// A token id past the vocabulary, or a batch longer than the position table.
    pub fn forward(&self, batch: &Batch) -> crate::Result<Tensor<D>> {
        let (size, seq, hidden) = (batch.batch, batch.seq, self.config.hidden_size);
        let heads = self.config.num_attention_heads;
        let positions: Vec<u32> = (0..batch.batch).flat_map(|_| 0..seq as u32).collect();
        let types = vec![0u32; batch.ids.len()];
        let embedded = self
            .embeddings
            .words
            .forward(&batch.ids)?
            .add(&self.embeddings.positions.forward(&positions)?)?
            .add(&self.embeddings.token_types.forward(&types)?)?;
        let mut x = self.embeddings.norm.forward(&embedded)?;
        let split_heads = |t: Tensor<D>| -> crate::Result<Tensor<D>> {
            Ok(Compute::contiguous(
                &Compute::reshape(&t, &[size, seq, heads, hidden / heads])?.permute(&[0, 2, 1, 3])?,
            )?)
        };
        for layer in &self.layers {
            let q = split_heads(layer.q.forward(&x)?)?;
            let k = split_heads(layer.k.forward(&x)?)?;
            let v = split_heads(layer.v.forward(&x)?)?;
            let context = Compute::attention(&q, &k, &v, false, Some(&batch.mask))?;
            let merged = Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[size * seq, hidden])?;
            x = layer.attn_norm.forward(&layer.attn_out.forward(&merged)?.add(&x)?)?;
            let inner = layer.up.forward(&x)?.gelu()?;
            x = layer.out_norm.forward(&layer.down.forward(&inner)?.add(&x)?)?;
        }
        Ok(Compute::reshape(&x, &[size, seq, hidden])?)
    }

    /// Sentence embeddings as sentence-transformers makes them: the hidden states averaged over
    /// the real tokens, then scaled to unit length. `[batch, hidden]` in F32.
    ///
    /// # Errors
    /// As [`Bert::forward`].
    pub fn embed(&self, batch: &Batch) -> crate::Result<Tensor<D>> {
        Ok(self.forward(batch)?.mean_pool(&batch.mask)?.l2_normalize()?)
    }
}

/// A folder of `BertModel` (`model_type` `bert`), the encoder without its pooler: the pooler of
/// a transformers checkpoint is left unused on import.
impl crate::Pretrained for Bert {
    type Config = BertConfig;
    const MODEL_TYPE: &'static str = "bert";
    const ARCHITECTURE: &'static str = "BertModel";

    fn config(&self) -> &BertConfig {
        &self.config
    }

    fn build(config: &BertConfig, dtype: DType) -> crate::Result<Bert> {
        Ok(Bert::new(config, dtype, Init::Meta))
    }

    fn check_config(config: &BertConfig, path: &Path) -> crate::Result<()> {
        config.check(path)
    }
}
