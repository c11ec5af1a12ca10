//! BERT encoders as Hugging Face stores them (`embeddings.*`, `encoder.layer.N.attention.self.query`,
//! ...), with the sentence-embedding head of sentence-transformers: mean pooling over the
//! attention mask, then L2 normalisation. all-MiniLM-L6-v2 is one of these.

use std::path::Path;

use nnx_core::fused::{Epilogue, FusedLayerNorm, FusedLinear, packed_attention};

use crate::nn::{Embedding, Init, LayerNorm, Linear};
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a BERT `config.json` that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](BertConfig::extra), so a configuration
/// read and written again ([`crate::Pretrained::save_pretrained`]) loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
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
    /// read (within a bound): nnx does not use them and writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(BertConfig);

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
        )?;
        checks.at_most("max_position_embeddings", self.max_position_embeddings, super::decoder::MAX_CONTEXT)?;
        checks.finite_non_negative("layer_norm_eps", self.layer_norm_eps)
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
            Compute::contiguous(&Compute::reshape(&t, &[size, seq, heads, hidden / heads])?.permute(&[0, 2, 1, 3])?)
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
        Compute::reshape(&x, &[size, seq, hidden])
    }

    /// Sentence embeddings as sentence-transformers makes them: the hidden states averaged over
    /// the real tokens, then scaled to unit length. `[batch, hidden]` in F32.
    ///
    /// # Errors
    /// As [`Bert::forward`].
    pub fn embed(&self, batch: &Batch) -> crate::Result<Tensor<D>> {
        self.forward(batch)?.mean_pool(&batch.mask)?.l2_normalize()
    }
}

/// A [`Bert`] on the host prepared for the fused CPU kernels of [`nnx_core::fused`]: each
/// layer's query, key and value projections concatenated into one product, biases, GELU and the
/// residual layer norms applied to each block of a product's rows while it is in cache, and the
/// sequences of a batch packed one after another without padding, so that no row of padding is
/// multiplied and no padded key is scored.
///
/// It holds the linear layers' weights transposed to `[in, out]` in f32 (a copy made once, the
/// size of the layers in f32) and reads the embedding tables in place. It computes the
/// embeddings of [`Bert::embed`] to within float rounding.
#[derive(Debug)]
pub struct FusedBert {
    words: Tensor,
    positions: Tensor,
    /// Row 0 of the token-type table, the only type a sentence embedding uses.
    token_type: Vec<f32>,
    norm: FusedLayerNorm,
    layers: Vec<FusedLayer>,
    hidden: usize,
    heads: usize,
    intermediate: usize,
}

/// One encoder layer of a [`FusedBert`].
#[derive(Debug)]
struct FusedLayer {
    qkv: FusedLinear,
    attn_out: FusedLinear,
    attn_norm: FusedLayerNorm,
    up: FusedLinear,
    down: FusedLinear,
    out_norm: FusedLayerNorm,
}

/// The buffers of a forward pass, reused from batch to batch.
#[derive(Default)]
struct Buffers {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    inner: Vec<f32>,
}

impl FusedBert {
    /// Prepares `model`.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] for a configuration that [`BertConfig::check`] refuses,
    /// [`crate::Error::ShapeMismatch`] for weights whose
    /// shapes do not fit it, and the errors of the tensors (meta or not float).
    pub fn new(model: &Bert) -> crate::Result<FusedBert> {
        const OP: &str = "FusedBert::new";
        let config = &model.config;
        config.check(Path::new("config.json"))?;
        let (hidden, intermediate) = (config.hidden_size, config.intermediate_size);
        let embeddings = &model.embeddings;
        let expect = |tensor: &Tensor, shape: &[usize], reason: &'static str| -> crate::Result<()> {
            let fits = tensor.rank() == shape.len()
                && tensor.shape().iter().zip(shape).all(|(&size, &expected)| expected == 0 || size == expected);
            if fits {
                return Ok(());
            }
            Err(nnx_core::Error::ShapeMismatch { op: OP, lhs: shape.to_vec(), rhs: tensor.shape().to_vec(), reason })
        };
        // A 0 in an expected shape takes any size.
        let table = "an embedding table must be `[rows, hidden_size]`";
        expect(&embeddings.words.weight, &[0, hidden], table)?;
        expect(&embeddings.positions.weight, &[0, hidden], table)?;
        expect(&embeddings.token_types.weight, &[0, hidden], table)?;
        let token_type = if embeddings.token_types.weight.shape()[0] > 0 {
            embeddings.token_types.weight.narrow(0, 0, 1)?.to_f32_vec()?
        } else {
            vec![0.0; hidden]
        };
        let linear = |layers: &[&Linear], shape: [usize; 2]| -> crate::Result<FusedLinear> {
            let fused = FusedLinear::concat(layers)?;
            let found = [fused.out_features(), fused.in_features()];
            if found != shape {
                return Err(nnx_core::Error::ShapeMismatch {
                    op: OP,
                    lhs: shape.to_vec(),
                    rhs: found.to_vec(),
                    reason: "a layer's weights must be `[out, in]` as the configuration sizes them",
                });
            }
            Ok(fused)
        };
        let norm = |norm: &LayerNorm| -> crate::Result<FusedLayerNorm> {
            expect(&norm.weight, &[hidden], "a norm must be `[hidden_size]`")?;
            FusedLayerNorm::new(norm)
        };
        let layers = model
            .layers
            .iter()
            .map(|layer| {
                Ok(FusedLayer {
                    qkv: linear(&[&layer.q, &layer.k, &layer.v], [3 * hidden, hidden])?,
                    attn_out: linear(&[&layer.attn_out], [hidden, hidden])?,
                    attn_norm: norm(&layer.attn_norm)?,
                    up: linear(&[&layer.up], [intermediate, hidden])?,
                    down: linear(&[&layer.down], [hidden, intermediate])?,
                    out_norm: norm(&layer.out_norm)?,
                })
            })
            .collect::<crate::Result<_>>()?;
        Ok(FusedBert {
            words: embeddings.words.weight.clone(),
            positions: embeddings.positions.weight.clone(),
            token_type,
            norm: norm(&embeddings.norm)?,
            layers,
            hidden,
            heads: config.num_attention_heads,
            intermediate,
        })
    }

    /// Sentence embeddings of `sequences` (token ids with the special tokens), in order, as
    /// [`Bert::embed`] makes them: the last hidden states averaged over each sequence, scaled
    /// to unit length. `batch_size` sequences go through the encoder together, their tokens
    /// packed: no sequence is padded to the length of another.
    ///
    /// # Errors
    /// A token id past the vocabulary, or a sequence longer than the position table.
    pub fn embed(&self, sequences: &[Vec<u32>], batch_size: usize) -> crate::Result<Vec<Vec<f32>>> {
        let hidden = self.hidden;
        self.embed_with(sequences, batch_size, |states| {
            // Mean pooling and L2 normalisation in the order of `mean_pool` and `l2_normalize`.
            let mut pooled = vec![0.0f32; hidden];
            let rows = states.chunks_exact(hidden);
            let length = rows.len();
            for row in rows {
                pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += x);
            }
            let inverse = 1.0 / (length as f32).max(1e-9);
            pooled.iter_mut().for_each(|p| *p *= inverse);
            let divisor = pooled.iter().map(|&x| x * x).sum::<f32>().sqrt().max(1e-12);
            pooled.iter_mut().for_each(|p| *p /= divisor);
            pooled
        })
    }

    /// The embeddings `pool` makes of each sequence's last hidden states, in order: it is given
    /// `length * hidden_size` values, token by token, without padding. The sequences go through
    /// the encoder as in [`FusedBert::embed`], `batch_size` at a time and packed.
    ///
    /// # Errors
    /// As [`FusedBert::embed`].
    pub fn embed_with(
        &self,
        sequences: &[Vec<u32>],
        batch_size: usize,
        mut pool: impl FnMut(&[f32]) -> Vec<f32>,
    ) -> crate::Result<Vec<Vec<f32>>> {
        let mut buffers = Buffers::default();
        let mut out = Vec::with_capacity(sequences.len());
        for batch in sequences.chunks(batch_size.max(1)) {
            let lengths: Vec<usize> = batch.iter().map(Vec::len).collect();
            self.encode(batch, &lengths, &mut buffers)?;
            let mut start = 0;
            for &length in &lengths {
                let end = start + length * self.hidden;
                out.push(pool(&buffers.hidden[start..end]));
                start = end;
            }
        }
        Ok(out)
    }

    /// The last hidden states of one batch of packed sequences, into `buffers.hidden`.
    fn encode(&self, batch: &[Vec<u32>], lengths: &[usize], buffers: &mut Buffers) -> crate::Result<()> {
        let tokens: usize = lengths.iter().sum();
        let ids = batch.concat();
        let positions: Vec<u32> = lengths.iter().flat_map(|&length| 0..length as u32).collect();
        let words = Tensor::embedding(&self.words, &ids)?;
        let places = Tensor::embedding(&self.positions, &positions)?;
        let hidden = &mut buffers.hidden;
        hidden.clear();
        hidden.extend(words.to_vec::<f32>()?);
        for (row, place) in hidden.chunks_exact_mut(self.hidden).zip(places.to_vec::<f32>()?.chunks_exact(self.hidden))
        {
            for ((x, &p), &t) in row.iter_mut().zip(place).zip(&self.token_type) {
                *x = (*x + p) + t;
            }
        }
        self.norm.forward_in_place(hidden);
        buffers.qkv.resize(tokens * 3 * self.hidden, 0.0);
        buffers.context.resize(tokens * self.hidden, 0.0);
        buffers.inner.resize(tokens * self.intermediate, 0.0);
        let Buffers { hidden, qkv, context, inner } = buffers;
        for layer in &self.layers {
            layer.qkv.forward_into(hidden, qkv, Epilogue::Bias);
            packed_attention(qkv, lengths, self.heads, context);
            layer.attn_out.forward_into(context, hidden, Epilogue::ResidualLayerNorm(&layer.attn_norm));
            layer.up.forward_into(hidden, inner, Epilogue::Gelu);
            layer.down.forward_into(inner, hidden, Epilogue::ResidualLayerNorm(&layer.out_norm));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BertConfig {
        BertConfig {
            vocab_size: 50,
            hidden_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 48,
            max_position_embeddings: 80,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            extra: serde_json::Map::new(),
        }
    }

    /// The fused path against the unfused one on padded batches: short sequences, long ones
    /// (attention through products), an empty one, and batch sizes that split them differently.
    #[test]
    fn fused_embeddings_match_the_padded_forward() {
        let model = Bert::new(&config(), DType::F32, Init::Seeded(7));
        let fused = FusedBert::new(&model).unwrap();
        let lengths = [3, 11, 1, 70, 0, 52, 8];
        let sequences: Vec<Vec<u32>> = lengths
            .iter()
            .enumerate()
            .map(|(index, &length)| (0..length).map(|at| ((index * 7 + at * 13) % 50) as u32).collect())
            .collect();
        for batch_size in [1, 3, 32] {
            let found = fused.embed(&sequences, batch_size).unwrap();
            assert_eq!(found.len(), sequences.len());
            for (sequence, embedding) in sequences.iter().zip(&found) {
                let expected =
                    model.embed(&Batch::pad(std::slice::from_ref(sequence), 0)).unwrap().to_f32_vec().unwrap();
                let difference = embedding.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(difference < 1e-5, "length {}: {difference}", sequence.len());
            }
        }
    }

    #[test]
    fn fused_embeddings_refuse_what_the_model_refuses() {
        let model = Bert::new(&config(), DType::F32, Init::Seeded(7));
        let fused = FusedBert::new(&model).unwrap();
        assert!(fused.embed(&[vec![50]], 8).is_err(), "a token id past the vocabulary");
        assert!(fused.embed(&[vec![1; 81]], 8).is_err(), "a sequence longer than the position table");
        let mut narrow = model.clone();
        narrow.layers[1].up = Linear::builder(32, 40).build();
        assert!(FusedBert::new(&narrow).is_err(), "a layer that does not fit the configuration");
    }
}
