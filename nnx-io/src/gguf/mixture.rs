//! Which ggml type each tensor of a model gets: one type for every tensor that may be
//! quantized, or one of llama.cpp's mixtures (`q4_k_m`: Q4_K, with Q6_K for the output and
//! for `attn_v`/`ffn_down` on the layers it favours), with per-tensor overrides by pattern and
//! llama.cpp's fallbacks for rows that do not hold whole blocks.

use nnx_core::quant::ggml::GgmlType;

use super::Metadata;
use crate::error::{Error, Result};

/// What `--type` names: a ggml type for every quantizable tensor, or a llama.cpp mixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// Every tensor that may be quantized gets this type (llama-quantize's `--pure`).
    Pure(GgmlType),
    /// One of llama.cpp's mixtures.
    Mixture(Mixture),
}

/// llama.cpp's mixtures (`LLAMA_FTYPE_MOSTLY_*`, what `llama-quantize TYPE` writes) that need no
/// importance matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Mixture {
    /// Q4_0, with Q6_K for the output.
    Q4_0,
    /// Q4_1, with Q6_K for the output.
    Q4_1,
    /// Q5_0, with Q6_K for the output.
    Q5_0,
    /// Q5_1, with Q6_K for the output.
    Q5_1,
    /// TQ1_0, with Q4_K for the token embedding and Q6_K for the output.
    TQ1_0,
    /// TQ2_0, with Q4_K for the token embedding and Q6_K for the output.
    TQ2_0,
    /// Q2_K, with Q3_K/Q4_K where llama.cpp bumps it.
    Q2_K,
    /// Q3_K small.
    Q3_K_S,
    /// Q3_K medium.
    Q3_K_M,
    /// Q3_K large.
    Q3_K_L,
    /// Q4_K small: Q5_K for the first `attn_v` and the first eighth of `ffn_down`.
    Q4_K_S,
    /// Q4_K medium: Q6_K for the output and half of `attn_v`/`ffn_down`.
    Q4_K_M,
    /// Q5_K small.
    Q5_K_S,
    /// Q5_K medium: Q6_K for half of `attn_v`/`ffn_down`.
    Q5_K_M,
    /// Q6_K everywhere.
    Q6_K,
    /// Q8_0 everywhere.
    Q8_0,
    /// IQ4_NL, with Q5_K where llama.cpp bumps it.
    IQ4_NL,
    /// IQ4_XS, with Q5_K where llama.cpp bumps it.
    IQ4_XS,
    /// MXFP4 for the stacks of experts (tensors of more than one matrix), Q8_0 for every
    /// other tensor it quantizes (gpt-oss as published).
    MXFP4_MOE,
}

const MIXTURES: &[(&str, Mixture, GgmlType, u32)] = &[
    ("q4_0", Mixture::Q4_0, GgmlType::Q4_0, 2),
    ("q4_1", Mixture::Q4_1, GgmlType::Q4_1, 3),
    ("q5_0", Mixture::Q5_0, GgmlType::Q5_0, 8),
    ("q5_1", Mixture::Q5_1, GgmlType::Q5_1, 9),
    ("tq1_0", Mixture::TQ1_0, GgmlType::TQ1_0, 36),
    ("tq2_0", Mixture::TQ2_0, GgmlType::TQ2_0, 37),
    ("q2_k", Mixture::Q2_K, GgmlType::Q2_K, 10),
    ("q3_k_s", Mixture::Q3_K_S, GgmlType::Q3_K, 11),
    ("q3_k_m", Mixture::Q3_K_M, GgmlType::Q3_K, 12),
    ("q3_k_l", Mixture::Q3_K_L, GgmlType::Q3_K, 13),
    ("q4_k_s", Mixture::Q4_K_S, GgmlType::Q4_K, 14),
    ("q4_k_m", Mixture::Q4_K_M, GgmlType::Q4_K, 15),
    ("q5_k_s", Mixture::Q5_K_S, GgmlType::Q5_K, 16),
    ("q5_k_m", Mixture::Q5_K_M, GgmlType::Q5_K, 17),
    ("q6_k", Mixture::Q6_K, GgmlType::Q6_K, 18),
    ("q8_0", Mixture::Q8_0, GgmlType::Q8_0, 7),
    ("iq4_nl", Mixture::IQ4_NL, GgmlType::IQ4_NL, 25),
    ("iq4_xs", Mixture::IQ4_XS, GgmlType::IQ4_XS, 30),
    ("mxfp4_moe", Mixture::MXFP4_MOE, GgmlType::MXFP4, 38),
];

impl Mixture {
    fn row(self) -> &'static (&'static str, Mixture, GgmlType, u32) {
        MIXTURES.iter().find(|row| row.1 == self).expect("every mixture has a row")
    }

    /// The mixture's name (`q4_k_m`).
    pub fn name(self) -> &'static str {
        self.row().0
    }

    /// The type of the tensors it does not single out.
    pub fn base(self) -> GgmlType {
        self.row().2
    }
}

/// llama-quantize's short names for the medium K mixtures.
const ALIASES: &[(&str, Mixture)] = &[("q3_k", Mixture::Q3_K_M), ("q4_k", Mixture::Q4_K_M), ("q5_k", Mixture::Q5_K_M)];

impl Recipe {
    /// Parses a `--type` value as `llama-quantize` reads its type: a mixture by llama.cpp's
    /// name (`q4_k_m`, `q4_0`, `iq4_xs`; `q4_k` is `q4_k_m`), else a ggml type nnx quantizes
    /// to for every tensor (`f16`, `bf16`, `f32`, `mxfp4`).
    pub fn parse(text: &str) -> Option<Recipe> {
        let lower = text.to_ascii_lowercase();
        let mut named = MIXTURES.iter().map(|row| (row.0, row.1)).chain(ALIASES.iter().copied());
        if let Some((_, mixture)) = named.find(|(name, _)| *name == lower) {
            return Some(Recipe::Mixture(mixture));
        }
        GgmlType::from_name(&lower).filter(|&ty| nnx_core::quant::ggml::can_quantize(ty)).map(Recipe::Pure)
    }

    /// The same type for every tensor that may be quantized, without the mixture's choices
    /// (llama-quantize's `--pure`).
    pub fn pure(self) -> Recipe {
        Recipe::Pure(self.base())
    }

    /// Every name [`Recipe::parse`] takes, for messages.
    pub fn names() -> String {
        let mixtures: Vec<&str> = MIXTURES.iter().map(|row| row.0).chain(ALIASES.iter().map(|row| row.0)).collect();
        let types: Vec<String> = GgmlType::all()
            .filter(|&ty| nnx_core::quant::ggml::can_quantize(ty))
            .map(|ty| ty.name().to_lowercase())
            .filter(|name| !mixtures.contains(&name.as_str()))
            .collect();
        format!("mixtures {}; types {}", mixtures.join(" "), types.join(" "))
    }

    /// The `general.file_type` (llama.cpp's `LlamaFileType`) a file made this way declares.
    pub fn file_type(self) -> u32 {
        match self {
            Recipe::Mixture(mixture) => mixture.row().3,
            Recipe::Pure(ty) => match ty {
                GgmlType::F32 => 0,
                GgmlType::F16 => 1,
                GgmlType::Q4_0 => 2,
                GgmlType::Q4_1 => 3,
                GgmlType::Q8_0 => 7,
                GgmlType::Q5_0 => 8,
                GgmlType::Q5_1 => 9,
                GgmlType::Q2_K => 10,
                GgmlType::Q3_K => 12,
                GgmlType::Q4_K => 15,
                GgmlType::Q5_K => 17,
                GgmlType::Q6_K => 18,
                GgmlType::IQ4_NL => 25,
                GgmlType::IQ4_XS => 30,
                GgmlType::BF16 => 32,
                GgmlType::TQ1_0 => 36,
                GgmlType::TQ2_0 => 37,
                GgmlType::MXFP4 => 38,
                _ => 1024,
            },
        }
    }

    /// The type of the tensors the recipe does not single out.
    pub fn base(self) -> GgmlType {
        match self {
            Recipe::Pure(ty) => ty,
            Recipe::Mixture(mixture) => mixture.base(),
        }
    }
}

/// A tensor's role, as llama.cpp's rules tell them apart by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Output,
    TokenEmbedding,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn role(name: &str) -> Role {
    if name == "output.weight" {
        return Role::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Role::TokenEmbedding;
    }
    let has = |part: &str| name.contains(part);
    match () {
        _ if has("attn_qkv.weight") => Role::AttnQkv,
        _ if has("attn_kv_b.weight") => Role::AttnKvB,
        _ if has("attn_v.weight") => Role::AttnV,
        _ if has("attn_k.weight") => Role::AttnK,
        _ if has("attn_q.weight") => Role::AttnQ,
        _ if has("attn_output.weight") => Role::AttnOutput,
        _ if has("ffn_up") => Role::FfnUp,
        _ if has("ffn_gate") => Role::FfnGate,
        _ if has("ffn_down") => Role::FfnDown,
        _ => Role::Other,
    }
}

/// Whether llama.cpp quantizes a tensor of `shape` (row-major) at all: 2-D or more as ggml
/// counts axes (leading axes of one do not count: a `[1, 64]` gate is a vector), named
/// `*weight`, and none of the small or sensitive tensors it keeps (norms, expert gates,
/// position and token-type embeddings, convolution and relative-position weights).
pub fn may_quantize(name: &str, shape: &[usize]) -> bool {
    let dims = shape.len() - shape.iter().take_while(|&&size| size == 1).count().min(shape.len().saturating_sub(1));
    const KEPT: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        ".position_embd",
        ".rel_pos",
        ".patch_embd",
    ];
    dims >= 2
        && name.ends_with("weight")
        && !KEPT.iter().any(|part| name.contains(part))
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

/// Whether a layer gets more bits in llama.cpp's medium mixtures: the first and last eighth,
/// and every third layer between.
fn use_more_bits(layer: i64, layers: i64) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

/// The type a row of `cols` values can take instead of `ty` when it does not hold whole
/// blocks of it, as llama.cpp falls back; F16 when even that does not fit.
pub fn fallback(ty: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let smaller = match ty {
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if cols.is_multiple_of(smaller.block_size()) { smaller } else { GgmlType::F16 }
}

/// A tensor's type chooser: walks the tensors in file order, as llama.cpp's counters do.
#[derive(Debug)]
pub struct TypePlan {
    recipe: Recipe,
    overrides: Vec<(regex::Regex, GgmlType)>,
    layers: i64,
    gqa: i64,
    experts: i64,
    falcon: bool,
    tied: bool,
    attn_v_total: i64,
    attn_v_seen: i64,
    ffn_down_seen: i64,
}

impl TypePlan {
    /// A plan for the tensors `names` (in file order) of a model described by `metadata`
    /// (block count, heads, experts: llama.cpp's rules depend on them), with overrides
    /// `(pattern, type)` tried in order, the first whose regular expression is found in a
    /// tensor's name winning (llama-quantize's `--tensor-type`).
    ///
    /// # Errors
    /// [`Error::Pattern`] for a pattern that is not a regular expression.
    pub fn new(
        recipe: Recipe,
        metadata: &Metadata,
        names: &[&str],
        overrides: &[(&str, GgmlType)],
    ) -> Result<TypePlan> {
        let overrides = overrides
            .iter()
            .map(|&(pattern, ty)| {
                regex::Regex::new(pattern)
                    .map(|regex| (regex, ty))
                    .map_err(|error| Error::Pattern { pattern: pattern.to_string(), message: error.to_string() })
            })
            .collect::<Result<Vec<_>>>()?;
        let arch = metadata.architecture().unwrap_or_default();
        let key = |suffix: &str| metadata.get(&format!("{arch}.{suffix}")).and_then(|v| v.as_i64());
        let layers = key("block_count").unwrap_or_else(|| {
            names
                .iter()
                .filter_map(|n| n.strip_prefix("blk.")?.split('.').next()?.parse::<i64>().ok())
                .max()
                .map_or(0, |n| n + 1)
        });
        let heads = key("attention.head_count").unwrap_or(1).max(1);
        let kv_heads = key("attention.head_count_kv").unwrap_or(heads).max(1);
        Ok(TypePlan {
            recipe,
            overrides,
            layers,
            gqa: heads / kv_heads,
            experts: key("expert_count").unwrap_or(0),
            falcon: arch == "falcon",
            tied: !names.contains(&"output.weight"),
            attn_v_total: names
                .iter()
                .filter(|n| matches!(role(n), Role::AttnV | Role::AttnQkv | Role::AttnKvB))
                .count() as i64,
            attn_v_seen: 0,
            ffn_down_seen: 0,
        })
    }

    /// The type of the next tensor, `name` of `shape` stored as `stored` (kept when the tensor
    /// may not be quantized).
    pub fn next(&mut self, name: &str, shape: &[usize], stored: GgmlType) -> GgmlType {
        if !may_quantize(name, shape) {
            return stored;
        }
        let cols = shape.last().copied().unwrap_or(1);
        let base = self.recipe.base();
        let chosen = match self.overridden(name) {
            Some(ty) => ty,
            None => match self.recipe {
                Recipe::Pure(ty) => ty,
                // llama.cpp gives this mixture no per-role rule: experts or Q8_0.
                Recipe::Mixture(Mixture::MXFP4_MOE) => match shape {
                    [experts, _, _, ..] if *experts > 1 => GgmlType::MXFP4,
                    _ => GgmlType::Q8_0,
                },
                Recipe::Mixture(mixture) => self.mixture_type(mixture, name, cols),
            },
        };
        if base.is_quantized() || chosen.is_quantized() { fallback(chosen, cols) } else { chosen }
    }

    /// The type the overrides give `name`: that of the first pattern found in it, `None` when
    /// none is. The tensor is not counted as one of the plan's (see [`TypePlan::next`]).
    pub fn overridden(&self, name: &str) -> Option<GgmlType> {
        self.overrides.iter().find(|(pattern, _)| pattern.is_match(name)).map(|&(_, ty)| ty)
    }

    fn mixture_type(&mut self, mixture: Mixture, name: &str, cols: usize) -> GgmlType {
        use GgmlType as T;
        use Mixture as M;
        let mut ty = mixture.base();
        let role = role(name);
        let eight_experts = self.experts == 8;
        match role {
            Role::Output | Role::TokenEmbedding if role == Role::Output || self.tied => {
                if self.falcon || !cols.is_multiple_of(ty.block_size()) {
                    ty = T::Q8_0;
                } else if ty != T::Q8_0 {
                    ty = T::Q6_K;
                }
            }
            Role::TokenEmbedding if matches!(mixture, M::TQ1_0 | M::TQ2_0) => ty = T::Q4_K,
            Role::TokenEmbedding => {}
            Role::AttnV | Role::AttnQkv | Role::AttnKvB => {
                let (i, n) = (self.attn_v_seen, self.attn_v_total);
                ty = match mixture {
                    M::Q2_K if self.gqa >= 4 => T::Q4_K,
                    M::Q2_K => T::Q3_K,
                    M::Q3_K_M if i < 2 => T::Q5_K,
                    M::Q3_K_M => T::Q4_K,
                    M::Q3_K_L => T::Q5_K,
                    M::IQ4_NL | M::IQ4_XS if self.gqa >= 4 => T::Q5_K,
                    M::Q4_K_M | M::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    M::Q4_K_S if i < 4 => T::Q5_K,
                    _ => ty,
                };
                if eight_experts {
                    ty = T::Q8_0;
                }
                // A fused `attn_qkv` counts as a value projection and takes its rule only:
                // llama-quantize's own rule for it comes after the value projections' in the
                // same chain of cases, which a fused projection never reaches.
                self.attn_v_seen += 1;
            }
            Role::AttnK if eight_experts => ty = T::Q8_0,
            Role::FfnDown => {
                let (i, n) = (self.ffn_down_layer(name), self.layers);
                ty = match mixture {
                    M::Q2_K => T::Q3_K,
                    M::Q3_K_M if i < n / 16 => T::Q5_K,
                    M::Q3_K_M if !self.falcon || use_more_bits(i, n) => T::Q4_K,
                    M::Q3_K_M => T::Q3_K,
                    M::Q3_K_L if self.falcon => T::Q4_K,
                    M::Q3_K_L => T::Q5_K,
                    M::Q4_K_M if self.falcon && i < n / 16 => T::Q6_K,
                    M::Q4_K_M if self.falcon && use_more_bits(i, n) => T::Q5_K,
                    M::Q4_K_M if self.falcon => T::Q4_K,
                    M::Q4_K_M if use_more_bits(i, n) => T::Q6_K,
                    M::IQ4_NL | M::IQ4_XS if i < n / 8 => T::Q5_K,
                    M::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    M::Q4_K_S if !self.falcon && i < n / 8 => T::Q5_K,
                    _ => ty,
                };
                self.ffn_down_seen += 1;
            }
            Role::AttnOutput if !self.falcon && eight_experts => {
                if matches!(mixture, M::Q2_K | M::Q3_K_S | M::Q3_K_M | M::IQ4_NL | M::Q4_K_S | M::Q4_K_M | M::IQ4_XS) {
                    ty = T::Q5_K;
                }
            }
            Role::AttnOutput if !self.falcon => {
                ty = match mixture {
                    M::Q2_K => T::Q3_K,
                    M::Q3_K_M => T::Q4_K,
                    M::Q3_K_L => T::Q5_K,
                    _ => ty,
                };
            }
            Role::AttnOutput if mixture == M::Q3_K_L => ty = T::Q4_K,
            _ => {}
        }
        ty
    }

    /// The layer an `ffn_down` tensor belongs to: its place among them, or, in models with
    /// experts (whose tensors llama.cpp does not find in layer order), the number in its name.
    fn ffn_down_layer(&self, name: &str) -> i64 {
        if self.experts > 1
            && let Some(layer) = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()?.parse().ok())
        {
            return layer;
        }
        self.ffn_down_seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;

    fn llama(layers: usize, heads: u32, kv_heads: u32) -> (Metadata, Vec<String>) {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("llama".into()));
        metadata.set("llama.block_count", Value::U32(layers as u32));
        metadata.set("llama.attention.head_count", Value::U32(heads));
        metadata.set("llama.attention.head_count_kv", Value::U32(kv_heads));
        let mut names = vec!["token_embd.weight".to_string()];
        for i in 0..layers {
            for part in
                ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
            {
                names.push(format!("blk.{i}.{part}.weight"));
            }
        }
        names.extend(["output_norm.weight".to_string(), "output.weight".to_string()]);
        (metadata, names)
    }

    fn plan(recipe: &str, layers: usize, kv_heads: u32, cols: usize) -> Vec<(String, GgmlType)> {
        let (metadata, names) = llama(layers, 32, kv_heads);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut plan = TypePlan::new(Recipe::parse(recipe).unwrap(), &metadata, &refs, &[]).unwrap();
        names
            .iter()
            .map(|name| {
                let shape: Vec<usize> = if name.contains("norm") { vec![cols] } else { vec![cols, cols] };
                (name.clone(), plan.next(name, &shape, GgmlType::F16))
            })
            .collect()
    }

    fn of(chosen: &[(String, GgmlType)], name: &str) -> GgmlType {
        chosen.iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn q4_k_m_gives_q6_k_to_the_output_and_to_attn_v_and_ffn_down_on_the_favoured_layers() {
        // 32 layers: the first 4, the last 4 and every third between get Q6_K.
        let chosen = plan("q4_k_m", 32, 8, 4096);
        assert_eq!(of(&chosen, "output.weight"), GgmlType::Q6_K);
        assert_eq!(of(&chosen, "token_embd.weight"), GgmlType::Q4_K);
        assert_eq!(of(&chosen, "blk.0.attn_norm.weight"), GgmlType::F16, "1-D norms are kept");
        let favoured: Vec<usize> = (0..32).filter(|&i| use_more_bits(i as i64, 32)).collect();
        assert_eq!(favoured, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
        for i in 0..32 {
            let expected = if favoured.contains(&i) { GgmlType::Q6_K } else { GgmlType::Q4_K };
            assert_eq!(of(&chosen, &format!("blk.{i}.attn_v.weight")), expected, "attn_v {i}");
            assert_eq!(of(&chosen, &format!("blk.{i}.ffn_down.weight")), expected, "ffn_down {i}");
            assert_eq!(of(&chosen, &format!("blk.{i}.attn_q.weight")), GgmlType::Q4_K);
        }
    }

    #[test]
    fn q4_k_s_and_tied_embeddings_and_rows_without_whole_blocks_follow_llama_cpp() {
        let chosen = plan("q4_k_s", 16, 32, 4096);
        assert_eq!(of(&chosen, "blk.3.attn_v.weight"), GgmlType::Q5_K);
        assert_eq!(of(&chosen, "blk.4.attn_v.weight"), GgmlType::Q4_K);
        assert_eq!(of(&chosen, "blk.1.ffn_down.weight"), GgmlType::Q5_K);
        assert_eq!(of(&chosen, "blk.2.ffn_down.weight"), GgmlType::Q4_K);
        // MiniLM-sized rows (384) do not hold 256-blocks: Q4_K falls back to Q5_0, and the
        // output to Q8_0.
        let chosen = plan("q4_k_m", 4, 32, 384);
        assert_eq!(of(&chosen, "blk.1.attn_q.weight"), GgmlType::Q5_0);
        assert_eq!(of(&chosen, "blk.3.attn_v.weight"), GgmlType::Q8_0, "Q6_K falls back to Q8_0");
        assert_eq!(of(&chosen, "blk.1.attn_v.weight"), GgmlType::Q5_0);
        assert_eq!(of(&chosen, "output.weight"), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q4_0, 100), GgmlType::F16);
        // Without an output tensor, the token embedding is the output.
        let (metadata, mut names) = llama(2, 8, 8);
        names.retain(|name| name != "output.weight");
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut plan = TypePlan::new(Recipe::parse("q5_k_m").unwrap(), &metadata, &refs, &[]).unwrap();
        assert_eq!(plan.next("token_embd.weight", &[32000, 4096], GgmlType::F16), GgmlType::Q6_K);
    }

    #[test]
    fn overrides_win_and_pure_types_apply_everywhere() {
        let (metadata, names) = llama(2, 8, 8);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let overrides = [(r"attn_(q|k)\.weight", GgmlType::Q8_0)];
        let mut plan = TypePlan::new(Recipe::parse("q4_0").unwrap().pure(), &metadata, &refs, &overrides).unwrap();
        assert!(matches!(
            TypePlan::new(Recipe::parse("q4_0").unwrap(), &metadata, &refs, &[("(", GgmlType::Q8_0)]),
            Err(Error::Pattern { .. })
        ));
        assert_eq!(plan.next("token_embd.weight", &[64, 64], GgmlType::F32), GgmlType::Q4_0);
        assert_eq!(plan.next("blk.0.attn_q.weight", &[64, 64], GgmlType::F32), GgmlType::Q8_0);
        assert_eq!(plan.next("blk.0.attn_v.weight", &[64, 64], GgmlType::F32), GgmlType::Q4_0);
        assert_eq!(plan.next("output.weight", &[64, 64], GgmlType::F32), GgmlType::Q4_0);
        assert_eq!(plan.next("blk.0.attn_norm.weight", &[64], GgmlType::F32), GgmlType::F32);
        assert_eq!(plan.overridden("blk.1.attn_k.weight"), Some(GgmlType::Q8_0));
        assert_eq!(plan.overridden("blk.1.attn_v.weight"), None);
        assert_eq!(Recipe::parse("Q4_K_M"), Some(Recipe::Mixture(Mixture::Q4_K_M)));
        assert_eq!(Recipe::parse("q4_k"), Some(Recipe::Mixture(Mixture::Q4_K_M)), "llama-quantize's alias");
        assert_eq!(Recipe::parse("q4_k").unwrap().pure(), Recipe::Pure(GgmlType::Q4_K));
        assert_eq!(Recipe::parse("mxfp4"), Some(Recipe::Pure(GgmlType::MXFP4)));
        assert_eq!(Recipe::parse("iq2_xxs"), None, "types that need an importance matrix are not offered");
        assert_eq!(Recipe::parse("q4_k_m").unwrap().file_type(), 15);
    }
}
