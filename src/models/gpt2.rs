//! GPT-2 as Hugging Face stores it: `transformer.h.N.attn.c_attn` holds q, k and v fused in a
//! Conv1D (`[in, 3 * out]`, the transpose of a `Linear`), and `lm_head` is tied to
//! `transformer.wte` and absent from the file.

use std::path::Path;

use crate::generate::KvCache;
use crate::nn::{Embedding, Init, LayerNorm, Linear};
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a GPT-2 `config.json` that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](Gpt2Config::extra), so a configuration
/// read and written again ([`crate::Pretrained::save_pretrained`]) loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct Gpt2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Longest sequence (learned positions).
    pub n_positions: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Width of the MLP (default `4 * n_embd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_inner: Option<usize>,
    /// LayerNorm epsilon.
    #[serde(default = "default_epsilon")]
    pub layer_norm_epsilon: f32,
    /// Every other field of the file (`model_type`, `activation_function`, token ids, ...),
    /// as read (within a bound): nnx does not use them and writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(Gpt2Config);

fn default_epsilon() -> f32 {
    1e-5
}

impl Gpt2Config {
    /// Reads a `config.json` and [checks](Gpt2Config::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<Gpt2Config> {
        super::read_config(path.as_ref(), Gpt2Config::check)
    }

    /// Checks that the configuration makes a model: every size at least 1, `n_head` dividing
    /// `n_embd`, at most [`MAX_LAYERS`](super::MAX_LAYERS) layers, and weights small enough
    /// to address. `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        checks.positive("vocab_size", self.vocab_size)?;
        checks.positive("n_positions", self.n_positions)?;
        checks.positive("n_embd", self.n_embd)?;
        checks.positive("n_head", self.n_head)?;
        checks.divides("n_head", self.n_head, ("n_embd", self.n_embd))?;
        checks.at_most("n_layer", self.n_layer, super::MAX_LAYERS)?;
        if let Some(inner) = self.n_inner {
            checks.positive("n_inner", inner)?;
        }
        let (width, inner) = (self.n_embd, self.n_inner.unwrap_or(self.n_embd.saturating_mul(4)));
        // A failure names a field the file sets: `n_inner` only when it is given.
        let mut fields = vec![("vocab_size", self.vocab_size), ("n_positions", self.n_positions), ("n_embd", width)];
        fields.extend(self.n_inner.map(|inner| ("n_inner", inner)));
        checks.addressable(
            &fields,
            self.n_layer,
            &[&[4, width, width], &[2, width, inner], &[10, width], &[1, inner]],
            &[&[self.vocab_size, width], &[self.n_positions, width], &[2, width]],
        )?;
        // Caches and position rows are sized from it.
        checks.at_most("n_positions", self.n_positions, super::decoder::MAX_CONTEXT)?;
        checks.finite_non_negative("layer_norm_epsilon", self.layer_norm_epsilon)
    }

    /// The MLP width.
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}

/// Self-attention: q, k and v are thirds of the fused `c_attn`.
#[derive(Module, Clone, Debug)]
pub struct Attention<D: Device = Host> {
    /// Query projection.
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 0), transpose)]
    pub q: Linear<D>,
    /// Key projection.
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 1), transpose)]
    pub k: Linear<D>,
    /// Value projection.
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 2), transpose)]
    pub v: Linear<D>,
    /// Output projection.
    #[nnx(from = "c_proj", transpose)]
    pub out: Linear<D>,
    /// Attention heads.
    #[nnx(skip)]
    pub heads: usize,
}

/// The feed-forward network.
#[derive(Module, Clone, Debug)]
pub struct Mlp<D: Device = Host> {
    /// `n_embd -> inner`.
    #[nnx(from = "c_fc", transpose)]
    pub up: Linear<D>,
    /// `inner -> n_embd`.
    #[nnx(from = "c_proj", transpose)]
    pub down: Linear<D>,
}

/// One pre-norm transformer block.
#[derive(Module, Clone, Debug)]
pub struct Block<D: Device = Host> {
    /// Norm before attention.
    pub ln_1: LayerNorm<D>,
    /// Self-attention.
    pub attn: Attention<D>,
    /// Norm before the MLP.
    pub ln_2: LayerNorm<D>,
    /// Feed-forward network.
    pub mlp: Mlp<D>,
}

/// GPT-2 with its language-model head.
#[derive(Module, Clone, Debug)]
pub struct Gpt2<D: Device = Host> {
    /// Token embeddings.
    #[nnx(from = "transformer.wte")]
    pub wte: Embedding<D>,
    /// Position embeddings.
    #[nnx(from = "transformer.wpe")]
    pub wpe: Embedding<D>,
    /// The blocks.
    #[nnx(from = "transformer.h")]
    pub h: Vec<Block<D>>,
    /// Final norm.
    #[nnx(from = "transformer.ln_f")]
    pub ln_f: LayerNorm<D>,
    /// Output projection, the token embedding itself.
    #[nnx(tie = "wte")]
    pub lm_head: Linear<D>,
    /// The configuration.
    #[nnx(skip)]
    pub config: Gpt2Config,
}

impl Gpt2 {
    /// A model of `config` in `dtype`; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &Gpt2Config, dtype: DType, init: Init) -> Gpt2 {
        let width = config.n_embd;
        let linear =
            |input: usize, output: usize, init: Init| Linear::builder(input, output).dtype(dtype).init(init).build();
        let norm = || LayerNorm::builder(width).eps(config.layer_norm_epsilon).dtype(dtype).init(init).build();
        let h = (0..config.n_layer)
            .map(|layer| {
                let init = init.at(&format!("h.{layer}"));
                Block {
                    ln_1: norm(),
                    attn: Attention {
                        q: linear(width, width, init.at("attn.q")),
                        k: linear(width, width, init.at("attn.k")),
                        v: linear(width, width, init.at("attn.v")),
                        out: linear(width, width, init.at("attn.out")),
                        heads: config.n_head,
                    },
                    ln_2: norm(),
                    mlp: Mlp {
                        up: linear(width, config.inner(), init.at("mlp.up")),
                        down: linear(config.inner(), width, init.at("mlp.down")),
                    },
                }
            })
            .collect();
        let embedding = |rows: usize, init: Init| Embedding::builder(rows, width).dtype(dtype).init(init).build();
        let wte = embedding(config.vocab_size, init.at("wte"));
        Gpt2 {
            lm_head: Linear { weight: wte.weight.clone(), bias: None },
            wte,
            wpe: embedding(config.n_positions, init.at("wpe")),
            h,
            ln_f: norm(),
            config: config.clone(),
        }
    }
}

impl<D: Device> Gpt2<D>
where
    Tensor<D>: Compute,
{
    /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32, on the model's
    /// device: the same code runs on the host and on the GPU.
    ///
    /// # Errors
    /// A token id past the vocabulary, or a sequence longer than `n_positions`.
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor<D>> {
        let (seq, width, heads) = (ids.len(), self.config.n_embd, self.config.n_head);
        let positions: Vec<u32> = (0..seq as u32).collect();
        let mut h = self.wte.forward(ids)?.add(&self.wpe.forward(&positions)?)?;
        let split_heads = |t: Tensor<D>| -> crate::Result<Tensor<D>> {
            Compute::contiguous(&Compute::reshape(&t, &[1, seq, heads, width / heads])?.permute(&[0, 2, 1, 3])?)
        };
        for block in &self.h {
            let x = block.ln_1.forward(&h)?;
            let (q, k, v) = (block.attn.q.forward(&x)?, block.attn.k.forward(&x)?, block.attn.v.forward(&x)?);
            let context = Compute::attention(&split_heads(q)?, &split_heads(k)?, &split_heads(v)?, true, None)?;
            let merged = Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[seq, width])?;
            h = h.add(&block.attn.out.forward(&merged)?)?;
            let x = block.ln_2.forward(&h)?;
            h = h.add(&block.mlp.down.forward(&block.mlp.up.forward(&x)?.gelu_tanh()?)?)?;
        }
        Compute::linear(&self.ln_f.forward(&h)?, &self.lm_head.weight, None)
    }

    /// The logits of the last token of each row of `ids` (one row per sequence of `cache`,
    /// row-major), `[batch, vocab]` in F32 on the model's device, computing only the new
    /// positions: their keys and values go into `cache`, and attention reads the cached ones.
    /// Positions count from each sequence's first real token (see [`KvCache`]).
    ///
    /// # Errors
    /// A token id past the vocabulary, `ids` that are not whole rows, or
    /// [`Error::CacheFull`](crate::Error::CacheFull).
    pub fn forward_with_cache(&self, ids: &[u32], cache: &mut KvCache<D>) -> crate::Result<Tensor<D>> {
        let batch = cache.batch();
        let seq = super::cached_rows(ids, batch)?;
        let (width, heads) = (self.config.n_embd, self.config.n_head);
        let positions: Vec<u32> = cache.positions(seq).into_iter().map(|position| position as u32).collect();
        let key_mask = cache.key_mask(seq);
        let mut h = self.wte.forward(ids)?.add(&self.wpe.forward(&positions)?)?;
        // `[batch * seq, width]` as `[batch, heads, seq, head_dim]`, a view.
        let split_heads = |t: Tensor<D>| -> crate::Result<Tensor<D>> {
            Compute::reshape(&t, &[batch, seq, heads, width / heads])?.permute(&[0, 2, 1, 3])
        };
        for (layer, block) in self.h.iter().enumerate() {
            let x = block.ln_1.forward(&h)?;
            let q = split_heads(block.attn.q.forward(&x)?)?;
            let (k, v) = (split_heads(block.attn.k.forward(&x)?)?, split_heads(block.attn.v.forward(&x)?)?);
            let (keys, values) = cache.update(layer, &k, &v)?;
            let context = Compute::attention(&q, &keys, &values, true, key_mask.as_deref())?;
            let merged = Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[batch * seq, width])?;
            h = h.add(&block.attn.out.forward(&merged)?)?;
            let x = block.ln_2.forward(&h)?;
            h = h.add(&block.mlp.down.forward(&block.mlp.up.forward(&x)?.gelu_tanh()?)?)?;
        }
        cache.advance(seq)?;
        let last =
            Compute::reshape(&Compute::reshape(&h, &[batch, seq, width])?.narrow(1, seq - 1, 1)?, &[batch, width])?;
        Compute::linear(&self.ln_f.forward(&last)?, &self.lm_head.weight, None)
    }
}

impl<D: Device> super::CausalLm for Gpt2<D>
where
    Tensor<D>: Compute,
{
    type Device = D;

    fn logits(&self, ids: &[u32]) -> crate::Result<Tensor> {
        Compute::to_host(&self.forward(ids)?)
    }

    /// `n_positions`.
    fn context_length(&self) -> usize {
        self.config.n_positions
    }

    fn new_cache(&self, batch: usize, capacity: usize) -> crate::Result<KvCache<D>> {
        super::check_capacity(capacity, self.context_length())?;
        let (heads, width) = (self.config.n_head, self.config.n_embd);
        KvCache::new(&self.wte.weight, self.h.len(), batch, heads, width / heads, capacity)
    }

    fn forward_cached(&self, ids: &[u32], cache: &mut KvCache<D>) -> crate::Result<Tensor> {
        Compute::to_host(&self.forward_with_cache(ids, cache)?)
    }
}

/// A folder of `GPT2LMHeadModel` (`model_type` `gpt2`): transformers' layout imports, nnx's
/// own layout loads strictly, and `lm_head` is saved once, as `wte`.
impl crate::Pretrained for Gpt2 {
    type Config = Gpt2Config;
    const MODEL_TYPE: &'static str = "gpt2";
    const ARCHITECTURE: &'static str = "GPT2LMHeadModel";

    fn config(&self) -> &Gpt2Config {
        &self.config
    }

    fn build(config: &Gpt2Config, dtype: DType) -> crate::Result<Gpt2> {
        Ok(Gpt2::new(config, dtype, Init::Meta))
    }

    fn check_config(config: &Gpt2Config, path: &Path) -> crate::Result<()> {
        config.check(path)
    }
}
