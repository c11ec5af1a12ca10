//! Transformers checkpoints of the architectures nnx knows, written as llama.cpp's converter
//! (`convert_hf_to_gguf.py`) writes them: its tensor names, its hyperparameter keys, the
//! tokenizer in `tokenizer.ggml.*`, and, for Llama-family attention, its row permutation of
//! the query and key projections (ggml's rotary embedding pairs neighbouring rows, where
//! transformers pairs the two halves of each head).

use std::path::Path;

use nnx_io::gguf::{Array, Metadata, Value};

use crate::models::gemma4::Gemma4Config;
use crate::models::llama::{DecoderConfig, LlamaConfig};
use crate::models::qwen35::Qwen35Config;
use crate::{Archive, Tensor};

/// A checkpoint ready to be written as GGUF: llama.cpp's metadata and the tensors under
/// llama.cpp's names (permuted where it permutes), in its order.
#[derive(Debug)]
pub struct GgufExport {
    /// Hyperparameters and tokenizer under llama.cpp's keys.
    pub metadata: Metadata,
    /// The tensors, named as llama.cpp names them.
    pub tensors: Archive,
    /// What was not carried over, for the user (a tokenizer nnx cannot express, say).
    pub notes: Vec<String>,
}

/// The GGUF form of the transformers folder `dir` when its `config.json` names an
/// architecture nnx exports (Llama); `None` for other folders.
///
/// # Errors
/// The errors of reading the configuration, the weights or the tokenizer; an entry the
/// architecture expects and the checkpoint lacks.
pub fn export(dir: &Path) -> crate::Result<Option<GgufExport>> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Ok(None);
    }
    let text = nnx_io::config::read_text(&config_path)?;
    let kind: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let model_type = kind["model_type"].as_str().unwrap_or_default();
    let Some(family) = super::family::from_model_type(model_type).filter(|family| family.exports_gguf) else {
        return Ok(None);
    };
    let Some(&arch) = family.gguf_architectures.first() else { return Ok(None) };
    // A checkpoint published quantized exports its decoded weights.
    let archive = super::text_model_view(crate::published::open(dir)?)?;
    let (mut export, ids, pre) = match family.network {
        super::family::Network::Qwen35 => {
            let config = Qwen35Config::from_file(&config_path)?;
            let export = qwen35(&config, &archive, dir, arch)?;
            (export, config.extra.clone(), None)
        }
        super::family::Network::Gemma4 => {
            let config = Gemma4Config::from_file(&config_path)?;
            let mut export = gemma4(&config, &archive, dir, arch)?;
            let tokenizer = dir.join("tokenizer.json");
            if tokenizer.is_file() {
                spaced_tokenizer_metadata(&tokenizer, &config.extra, &mut export)?;
            } else {
                export.notes.push("no tokenizer.json: the file has no tokenizer".into());
            }
            if let Some(name) = dir.file_name().and_then(|name| name.to_str()) {
                export.metadata.set("general.name", Value::String(name.to_string()));
            }
            return Ok(Some(export));
        }
        _ => {
            let config = LlamaConfig::from_file(&config_path)?;
            (llama(&config, &archive, dir, arch)?, config.extra.clone(), Some("default"))
        }
    };
    if let Some(name) = dir.file_name().and_then(|name| name.to_str()) {
        export.metadata.set("general.name", Value::String(name.to_string()));
    }
    let tokenizer = dir.join("tokenizer.json");
    if tokenizer.is_file() {
        tokenizer_metadata(&tokenizer, &ids, pre, &mut export)?;
    } else {
        export.notes.push("no tokenizer.json: the file has no tokenizer".into());
    }
    Ok(Some(export))
}

/// llama.cpp's order of value heads where key heads serve several: transformers groups the
/// `ratio` value heads of each key head together (`[key_heads, ratio, width]` along `axis`),
/// llama.cpp's converter tiles them (`[ratio, key_heads, width]`), so that value head `h`
/// reads key head `h % key_heads`. `range` is the part of `axis` holding the value heads.
fn tile_value_heads(
    tensor: &Tensor,
    axis: usize,
    range: std::ops::Range<usize>,
    (key_heads, ratio, width): (usize, usize, usize),
) -> crate::Result<Tensor> {
    let shape = tensor.shape().to_vec();
    let values = tensor.to_dtype(crate::DType::F32)?.to_vec::<f32>()?;
    let (outer, size) = (shape[..axis].iter().product::<usize>(), shape[axis]);
    let inner = shape[axis + 1..].iter().product::<usize>();
    let mut out = values.clone();
    for o in 0..outer {
        for g in 0..key_heads {
            for r in 0..ratio {
                for d in 0..width {
                    let from = range.start + (g * ratio + r) * width + d;
                    let to = range.start + (r * key_heads + g) * width + d;
                    let (src, dst) = ((o * size + from) * inner, (o * size + to) * inner);
                    out[dst..dst + inner].copy_from_slice(&values[src..src + inner]);
                }
            }
        }
    }
    Tensor::from_vec(out, &shape)?.to_dtype(tensor.dtype())
}

/// The GGUF form of a Qwen3.5 checkpoint (dense or MoE), as llama.cpp's converter writes it:
/// the norms that multiply by `1 + w` stored as `1 + w`, `A_log` as `-exp(A_log)`, the
/// convolution's unit axis dropped, the value heads tiled ([`tile_value_heads`]), the experts
/// stacked, the multi-token-prediction head kept as more blocks, and the hyperparameters under
/// `{arch}.ssm.*` and the decoder's keys.
fn qwen35(config: &Qwen35Config, archive: &Archive, dir: &Path, arch: &str) -> crate::Result<GgufExport> {
    let mut metadata = Metadata::new();
    let set = |metadata: &mut Metadata, key: &str, value: Value| metadata.set(format!("{arch}.{key}"), value);
    metadata.set("general.architecture", Value::String(arch.into()));
    let u32_of = |n: usize| Value::U32(n as u32);
    let layers = config.num_hidden_layers;
    set(&mut metadata, "context_length", u32_of(config.max_position_embeddings.unwrap_or(32_768)));
    set(&mut metadata, "embedding_length", u32_of(config.hidden_size));
    set(&mut metadata, "block_count", u32_of(layers));
    if let Some(inner) = config.intermediate_size {
        set(&mut metadata, "feed_forward_length", u32_of(inner));
    }
    set(&mut metadata, "attention.head_count", u32_of(config.num_attention_heads));
    set(&mut metadata, "attention.head_count_kv", u32_of(config.kv_heads()));
    set(&mut metadata, "attention.key_length", u32_of(config.head_dim()));
    set(&mut metadata, "attention.value_length", u32_of(config.head_dim()));
    set(&mut metadata, "attention.layer_norm_rms_epsilon", Value::F32(config.rms_norm_eps));
    set(&mut metadata, "rope.freq_base", Value::F32(config.theta()));
    set(&mut metadata, "rope.dimension_count", u32_of(config.rotated()));
    let mut sections: Vec<i32> = config
        .rope_parameters
        .as_ref()
        .and_then(|rope| rope.extra.get("mrope_section"))
        .and_then(|sections| serde_json::from_value(sections.clone()).ok())
        .unwrap_or_else(|| vec![11, 11, 10]);
    sections.resize(4, 0);
    set(&mut metadata, "rope.dimension_sections", Value::Array(Array::I32(sections)));
    let dims = config.delta_dims(true);
    set(&mut metadata, "ssm.conv_kernel", u32_of(dims.kernel));
    set(&mut metadata, "ssm.state_size", u32_of(dims.key_dim));
    set(&mut metadata, "ssm.group_count", u32_of(dims.key_heads));
    set(&mut metadata, "ssm.time_step_rank", u32_of(dims.value_heads));
    set(&mut metadata, "ssm.inner_size", u32_of(dims.value_heads * dims.value_dim));
    // The multi-token-prediction head, kept as the converter keeps it: more blocks after the
    // model's, full-attention layers, counted by `nextn_predict_layers`.
    let predict = match archive.contains("mtp.fc.weight") {
        true => config.mtp_num_hidden_layers.unwrap_or_else(|| {
            (0..).take_while(|at| archive.contains(&format!("mtp.layers.{at}.input_layernorm.weight"))).count()
        }),
        false => 0,
    };
    if predict > 0 {
        set(&mut metadata, "block_count", u32_of(layers + predict));
        set(&mut metadata, "nextn_predict_layers", u32_of(predict));
    }
    let recurrent: Vec<bool> = (0..layers + predict).map(|layer| layer < layers && config.is_linear(layer)).collect();
    set(&mut metadata, "attention.recurrent_layers", Value::Array(Array::Bool(recurrent)));
    set(&mut metadata, "full_attention_interval", u32_of(config.full_attention_interval.unwrap_or(4)));
    if config.is_moe() {
        let experts = config.num_experts.unwrap_or(0);
        set(&mut metadata, "expert_count", u32_of(experts));
        set(&mut metadata, "expert_used_count", u32_of(config.num_experts_per_tok.unwrap_or(0)));
        set(&mut metadata, "expert_feed_forward_length", u32_of(config.moe_intermediate_size.unwrap_or(0)));
        if let Some(shared) = config.shared_expert_intermediate_size {
            set(&mut metadata, "expert_shared_feed_forward_length", u32_of(shared));
        }
    }

    let mut tensors = Archive::new();
    let take = |name: &str| {
        let tensor = archive.try_get(name)?;
        named(archive, dir, name, tensor.check_expansion(tensor.expansion_limit()))?;
        if tensor.rank() == 1 && tensor.dtype().is_castable_float() {
            return named(archive, dir, name, tensor.to_dtype(crate::DType::F32));
        }
        Ok(tensor)
    };
    // A norm of `x * (1 + w)`: llama.cpp's converter stores `1 + w`.
    let centred = |name: &str| -> crate::Result<Tensor> {
        let values = take(name)?.to_dtype(crate::DType::F32)?;
        named(archive, dir, name, values.add_scalar(1.0))
    };
    let (key_heads, ratio, width) = (dims.key_heads, dims.value_heads / dims.key_heads.max(1), dims.value_dim);
    let key_width = 2 * dims.key_heads * dims.key_dim;
    let tiled = |name: &str, axis: usize, range: std::ops::Range<usize>, width: usize| -> crate::Result<Tensor> {
        let tensor = take(name)?;
        if ratio == 1 {
            return Ok(tensor);
        }
        named(archive, dir, name, tile_value_heads(&tensor, axis, range, (key_heads, ratio, width)))
    };
    tensors.insert("token_embd.weight", take("model.embed_tokens.weight")?);
    let channels = dims.channels();
    let value_width = dims.value_heads * width;
    let main = (0..layers).map(|i| (format!("model.layers.{i}"), i));
    for (prefix, i) in main.chain((0..predict).map(|at| (format!("mtp.layers.{at}"), layers + at))) {
        let hf = |part: &str| format!("{prefix}.{part}");
        let blk = |part: &str| format!("blk.{i}.{part}");
        tensors.insert(blk("attn_norm.weight"), centred(&hf("input_layernorm.weight"))?);
        tensors.insert(blk("post_attention_norm.weight"), centred(&hf("post_attention_layernorm.weight"))?);
        if i < layers && config.is_linear(i) {
            let lin = |part: &str| hf(&format!("linear_attn.{part}"));
            tensors.insert(blk("attn_qkv.weight"), tiled(&lin("in_proj_qkv.weight"), 0, key_width..channels, width)?);
            tensors.insert(blk("attn_gate.weight"), tiled(&lin("in_proj_z.weight"), 0, 0..value_width, width)?);
            tensors.insert(blk("ssm_beta.weight"), tiled(&lin("in_proj_b.weight"), 0, 0..dims.value_heads, 1)?);
            tensors.insert(blk("ssm_alpha.weight"), tiled(&lin("in_proj_a.weight"), 0, 0..dims.value_heads, 1)?);
            let conv = take(&lin("conv1d.weight"))?;
            let conv = named(
                archive,
                dir,
                &lin("conv1d.weight"),
                conv.to_dtype(crate::DType::F32)?.reshape(&[channels, dims.kernel]),
            )?;
            let conv = match ratio {
                1 => conv,
                _ => tile_value_heads(&conv, 0, key_width..channels, (key_heads, ratio, width))?,
            };
            tensors.insert(blk("ssm_conv1d.weight"), conv);
            tensors.insert(blk("ssm_dt.bias"), tiled(&lin("dt_bias"), 0, 0..dims.value_heads, 1)?);
            let a_log = tiled(&lin("A_log"), 0, 0..dims.value_heads, 1)?.to_dtype(crate::DType::F32)?;
            let decay: Vec<f32> = a_log.to_vec::<f32>()?.iter().map(|a| -a.exp()).collect();
            tensors.insert(blk("ssm_a"), Tensor::from_vec(decay, &[dims.value_heads])?);
            tensors.insert(blk("ssm_norm.weight"), take(&lin("norm.weight"))?);
            tensors.insert(blk("ssm_out.weight"), tiled(&lin("out_proj.weight"), 1, 0..value_width, width)?);
        } else {
            for (ours, theirs) in
                [("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")]
            {
                tensors.insert(blk(&format!("{ours}.weight")), take(&hf(&format!("self_attn.{theirs}.weight")))?);
            }
            tensors.insert(blk("attn_q_norm.weight"), centred(&hf("self_attn.q_norm.weight"))?);
            tensors.insert(blk("attn_k_norm.weight"), centred(&hf("self_attn.k_norm.weight"))?);
        }
        if config.is_moe() {
            tensors.insert(blk("ffn_gate_inp.weight"), take(&hf("mlp.gate.weight"))?);
            let experts = config.num_experts.unwrap_or(0);
            for (ours, theirs) in
                [("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")]
            {
                let stack: Vec<Tensor> = (0..experts)
                    .map(|e| take(&hf(&format!("mlp.experts.{e}.{theirs}.weight"))))
                    .collect::<crate::Result<_>>()?;
                let [rows, cols] = stack.first().map_or([0, 0], |first| [first.shape()[0], first.shape()[1]]);
                let mut bytes = Vec::new();
                for expert in &stack {
                    bytes.extend_from_slice(&expert.contiguous().to_bytes()?);
                }
                let dtype = stack.first().map_or(crate::DType::F32, Tensor::dtype);
                tensors
                    .insert(blk(&format!("{ours}.weight")), Tensor::from_bytes(dtype, &[experts, rows, cols], &bytes)?);
            }
            tensors.insert(blk("ffn_gate_inp_shexp.weight"), take(&hf("mlp.shared_expert_gate.weight"))?);
            for (ours, theirs) in
                [("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"), ("ffn_down_shexp", "down_proj")]
            {
                tensors
                    .insert(blk(&format!("{ours}.weight")), take(&hf(&format!("mlp.shared_expert.{theirs}.weight")))?);
            }
        } else {
            for (ours, theirs) in [("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")] {
                tensors.insert(blk(&format!("{ours}.weight")), take(&hf(&format!("mlp.{theirs}.weight")))?);
            }
        }
    }
    if predict > 0 {
        let blk = |part: &str| format!("blk.{layers}.nextn.{part}");
        tensors.insert(blk("eh_proj.weight"), take("mtp.fc.weight")?);
        tensors.insert(blk("enorm.weight"), centred("mtp.pre_fc_norm_embedding.weight")?);
        tensors.insert(blk("hnorm.weight"), centred("mtp.pre_fc_norm_hidden.weight")?);
        tensors.insert(blk("shared_head_norm.weight"), centred("mtp.norm.weight")?);
    }
    tensors.insert("output_norm.weight", centred("model.norm.weight")?);
    if !config.tie_word_embeddings {
        tensors.insert("output.weight", take("lm_head.weight")?);
    }
    Ok(GgufExport { metadata, tensors, notes: Vec::new() })
}

/// ggml's row order of a query or key projection of `heads` heads: within each head, rows
/// `[a0 a1 .. b0 b1 ..]` (the two rotary halves) become `[a0 b0 a1 b1 ..]`.
///
/// A view read from a file is copied within its [`Tensor::expansion_limit`]: a layout that
/// repeats a few stored bytes into gigabytes is refused, not materialized.
///
/// # Errors
/// When the rows do not split into `heads` heads of an even size (or the tensor has no rows);
/// [`crate::Error::Expansion`] and [`crate::Error::Allocation`] for a view past its limit or
/// memory refused.
pub fn permute_rows(weight: &Tensor, heads: usize) -> crate::Result<Tensor> {
    let shape = weight.shape().to_vec();
    let Some((&rows, rest)) = shape.split_first() else {
        return Err(crate::Error::Reshape { from: shape.clone(), from_len: 1, to: vec![heads, 2, 0], to_len: 0 });
    };
    let half = rows / heads.max(1) / 2;
    let mut split = vec![heads, 2, half];
    split.extend(rest);
    let mut axes = vec![0, 2, 1];
    axes.extend(3..3 + rest.len());
    weight.contiguous_within(weight.expansion_limit())?.reshape(&split)?.permute(&axes)?.reshape(&shape)
}

/// `result` of working on entry `name` of `archive`, its error naming the entry and the file
/// it is stored in (or the folder `dir`).
fn named<T>(archive: &Archive, dir: &Path, name: &str, result: crate::Result<T>) -> crate::Result<T> {
    result.map_err(|source| {
        // The file the entry lies in; for formats without locations, the file the archive names.
        let origin = archive.origin().trim_matches('`');
        let fallback = if origin.is_empty() { dir.to_path_buf() } else { std::path::PathBuf::from(origin) };
        let path = archive.info(name).ok().and_then(|info| info.location).map_or(fallback, |at| at.path);
        crate::Error::Data { path, name: name.to_string(), source: Box::new(source) }
    })
}

/// The GGUF form of a Llama checkpoint, its keys under `arch` (`general.architecture`).
fn llama(config: &LlamaConfig, archive: &Archive, dir: &Path, arch: &str) -> crate::Result<GgufExport> {
    let mut metadata = Metadata::new();
    let set = |metadata: &mut Metadata, key: &str, value: Value| metadata.set(format!("{arch}.{key}"), value);
    metadata.set("general.architecture", Value::String(arch.into()));
    let u32_of = |n: usize| Value::U32(n as u32);
    set(&mut metadata, "context_length", u32_of(config.max_position_embeddings.unwrap_or(2048)));
    set(&mut metadata, "embedding_length", u32_of(config.hidden_size));
    set(&mut metadata, "block_count", u32_of(config.num_hidden_layers));
    set(&mut metadata, "feed_forward_length", u32_of(config.intermediate_size));
    set(&mut metadata, "rope.dimension_count", u32_of(config.head_dim()));
    set(&mut metadata, "attention.head_count", u32_of(config.num_attention_heads));
    set(&mut metadata, "attention.head_count_kv", u32_of(config.kv_heads()));
    set(&mut metadata, "attention.layer_norm_rms_epsilon", Value::F32(config.rms_norm_eps));
    set(&mut metadata, "rope.freq_base", Value::F32(config.theta()));
    if config.head_dim().checked_mul(config.num_attention_heads) != Some(config.hidden_size) {
        set(&mut metadata, "attention.key_length", u32_of(config.head_dim()));
        set(&mut metadata, "attention.value_length", u32_of(config.head_dim()));
    }

    let mut tensors = Archive::new();
    let mut notes = Vec::new();
    // Every tensor is written whole: a view that repeats a few stored bytes into gigabytes is
    // refused here, naming its file, before anything is copied. (A published checkpoint's
    // weights are decoded when read, into fresh tensors.)
    let checked = |name: &str| -> crate::Result<()> {
        if archive.encoding(name).is_none() {
            let tensor = archive.try_get(name)?;
            named(archive, dir, name, tensor.check_expansion(tensor.expansion_limit()))?;
        }
        Ok(())
    };
    // The entries are the folder's own, read as they are written and released after: memory
    // holds the tensors being written, not the model. llama.cpp's converter keeps 1-D tensors
    // (the norms) in f32, which every backend reads.
    let take = |tensors: &mut Archive, gguf: String, name: &str| -> crate::Result<()> {
        checked(name)?;
        let info = archive.info(name)?;
        if info.shape.len() == 1 && info.dtype.is_castable_float() {
            let tensor = archive.try_get(name)?;
            tensors.insert(gguf, named(archive, dir, name, tensor.to_dtype(crate::DType::F32))?);
            return Ok(());
        }
        tensors.insert_entry(gguf, archive, name)
    };
    // q and k with their rows in llama.cpp's rotary order, permuted when each is written.
    let permuted = |tensors: &mut Archive, gguf: String, name: &str, heads: usize| -> crate::Result<()> {
        checked(name)?;
        let info = archive.info(name)?;
        let spec = (info.dtype, info.shape);
        let (owned, folder) = (name.to_string(), dir.to_path_buf());
        tensors.insert_derived(gguf, spec, archive, vec![name.to_string()], move |archive| {
            named(archive, &folder, &owned, archive.try_get(&owned).and_then(|tensor| permute_rows(&tensor, heads)))
        });
        Ok(())
    };
    take(&mut tensors, "token_embd.weight".into(), "model.embed_tokens.weight")?;
    for i in 0..config.num_hidden_layers {
        let hf = |part: &str| format!("model.layers.{i}.{part}.weight");
        let blk = |part: &str| format!("blk.{i}.{part}.weight");
        take(&mut tensors, blk("attn_norm"), &hf("input_layernorm"))?;
        take(&mut tensors, blk("ffn_down"), &hf("mlp.down_proj"))?;
        take(&mut tensors, blk("ffn_gate"), &hf("mlp.gate_proj"))?;
        take(&mut tensors, blk("ffn_up"), &hf("mlp.up_proj"))?;
        take(&mut tensors, blk("ffn_norm"), &hf("post_attention_layernorm"))?;
        permuted(&mut tensors, blk("attn_k"), &hf("self_attn.k_proj"), config.kv_heads())?;
        take(&mut tensors, blk("attn_output"), &hf("self_attn.o_proj"))?;
        permuted(&mut tensors, blk("attn_q"), &hf("self_attn.q_proj"), config.num_attention_heads)?;
        take(&mut tensors, blk("attn_v"), &hf("self_attn.v_proj"))?;
    }
    take(&mut tensors, "output_norm.weight".into(), "model.norm.weight")?;
    if !config.tie_word_embeddings {
        take(&mut tensors, "output.weight".into(), "lm_head.weight")?;
    }
    if config.rope_parameters.as_ref().is_some_and(|rope| rope.extra.get("rope_type").is_some_and(|t| t != "default"))
        || config.extra.contains_key("rope_scaling")
    {
        notes.push(
            "the rope scaling of config.json is not written (llama.cpp stores Llama 3's as `rope_freqs.weight`)".into(),
        );
    }
    Ok(GgufExport { metadata, tensors, notes })
}

/// The GGUF form of a Gemma 4 text checkpoint (dense or MoE), as llama.cpp's converter writes
/// it: its names (norms as stored, `w`), the global layers' rotary divisors as
/// `rope_freqs.weight` (1 for the turned frequencies, 1e30 for the rest), the layer scales as
/// `layer_output_scale.weight`, the token embedding cut to the tokenizer's rows, and the
/// hyperparameters of both layer kinds (`_swa` for the sliding ones, arrays where the layers
/// differ).
fn gemma4(config: &Gemma4Config, archive: &Archive, dir: &Path, arch: &str) -> crate::Result<GgufExport> {
    let mut metadata = Metadata::new();
    let set = |metadata: &mut Metadata, key: &str, value: Value| metadata.set(format!("{arch}.{key}"), value);
    metadata.set("general.architecture", Value::String(arch.into()));
    let u32_of = |n: usize| Value::U32(n as u32);
    let layers = config.num_hidden_layers;
    let global = (0..layers).find(|&layer| !config.is_sliding(layer)).unwrap_or(0);
    let (local_dim, global_dim) = (config.head_dim, config.head_dim_of(global));
    set(&mut metadata, "context_length", u32_of(config.max_position_embeddings.unwrap_or(131_072)));
    set(&mut metadata, "embedding_length", u32_of(config.hidden_size));
    set(&mut metadata, "block_count", u32_of(layers));
    let widths: Vec<usize> = (0..layers).map(|layer| config.inner_of(layer)).collect();
    let per_layer = |values: &[usize]| match values.iter().all(|&value| value == values[0]) {
        true => u32_of(values[0]),
        false => Value::Array(Array::I32(values.iter().map(|&value| value as i32).collect())),
    };
    set(&mut metadata, "feed_forward_length", per_layer(&widths));
    set(&mut metadata, "attention.head_count", u32_of(config.num_attention_heads));
    let kv: Vec<usize> = (0..layers).map(|layer| config.kv_heads_of(layer)).collect();
    set(&mut metadata, "attention.head_count_kv", per_layer(&kv));
    set(&mut metadata, "attention.key_length", u32_of(global_dim));
    set(&mut metadata, "attention.value_length", u32_of(global_dim));
    set(&mut metadata, "attention.key_length_swa", u32_of(local_dim));
    set(&mut metadata, "attention.value_length_swa", u32_of(local_dim));
    let theta = |sliding: bool, default: f32| {
        let rope = config.rope_parameters.as_ref();
        let rope =
            rope.and_then(|rope| if sliding { rope.sliding_attention.as_ref() } else { rope.full_attention.as_ref() });
        rope.and_then(|rope| rope.rope_theta).unwrap_or(default)
    };
    set(&mut metadata, "rope.freq_base", Value::F32(theta(false, 1_000_000.0)));
    set(&mut metadata, "rope.freq_base_swa", Value::F32(theta(true, 10_000.0)));
    set(&mut metadata, "rope.dimension_count", u32_of(global_dim));
    set(&mut metadata, "rope.dimension_count_swa", u32_of(local_dim));
    set(&mut metadata, "attention.layer_norm_rms_epsilon", Value::F32(config.rms_norm_eps));
    set(&mut metadata, "attention.sliding_window", u32_of(config.sliding_window));
    let pattern: Vec<bool> = (0..layers).map(|layer| config.is_sliding(layer)).collect();
    set(&mut metadata, "attention.sliding_window_pattern", Value::Array(Array::Bool(pattern)));
    set(&mut metadata, "attention.shared_kv_layers", u32_of(config.num_kv_shared_layers));
    set(&mut metadata, "embedding_length_per_layer_input", u32_of(config.hidden_size_per_layer_input));
    if let Some(cap) = config.final_logit_softcapping.filter(|&cap| cap != 0.0) {
        set(&mut metadata, "final_logit_softcapping", Value::F32(cap));
    }
    if config.enable_moe_block {
        set(&mut metadata, "expert_count", u32_of(config.num_experts.unwrap_or(0)));
        set(&mut metadata, "expert_used_count", u32_of(config.top_k_experts.unwrap_or(0)));
        set(&mut metadata, "expert_feed_forward_length", u32_of(config.moe_intermediate_size.unwrap_or(0)));
    }

    let mut tensors = Archive::new();
    let take = |name: &str| {
        let tensor = archive.try_get(name)?;
        named(archive, dir, name, tensor.check_expansion(tensor.expansion_limit()))?;
        if tensor.rank() == 1 && tensor.dtype().is_castable_float() {
            return named(archive, dir, name, tensor.to_dtype(crate::DType::F32));
        }
        Ok(tensor)
    };
    // The converter's divisors of the global layers' frequencies: "proportional" rotary turns
    // the first part of them.
    let fraction = config
        .rope_parameters
        .as_ref()
        .and_then(|rope| rope.full_attention.as_ref())
        .and_then(|rope| rope.extra.get("partial_rotary_factor"))
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(1.0);
    let turned = (global_dim as f64 * fraction / 2.0) as usize;
    let freqs: Vec<f32> = (0..global_dim / 2).map(|at| if at < turned { 1.0 } else { 1e30 }).collect();
    tensors.insert("rope_freqs.weight", Tensor::from_vec(freqs, &[global_dim / 2])?);
    tensors.insert("token_embd.weight", take("model.embed_tokens.weight")?);
    let optional = |name: &str| archive.contains(name).then(|| take(name)).transpose();
    for (ours, theirs) in [
        ("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"),
        ("per_layer_model_proj.weight", "model.per_layer_model_projection.weight"),
        ("per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight"),
    ] {
        if let Some(tensor) = optional(theirs)? {
            tensors.insert(ours, tensor);
        }
    }
    for i in 0..layers {
        let hf = |part: &str| format!("model.layers.{i}.{part}");
        let blk = |part: &str| format!("blk.{i}.{part}");
        const NAMES: [(&str, &str); 25] = [
            ("attn_norm.weight", "input_layernorm.weight"),
            ("attn_q.weight", "self_attn.q_proj.weight"),
            ("attn_k.weight", "self_attn.k_proj.weight"),
            ("attn_v.weight", "self_attn.v_proj.weight"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
            ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            ("post_attention_norm.weight", "post_attention_layernorm.weight"),
            ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
            ("ffn_gate.weight", "mlp.gate_proj.weight"),
            ("ffn_up.weight", "mlp.up_proj.weight"),
            ("ffn_down.weight", "mlp.down_proj.weight"),
            ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
            ("inp_gate.weight", "per_layer_input_gate.weight"),
            ("proj.weight", "per_layer_projection.weight"),
            ("post_norm.weight", "post_per_layer_input_norm.weight"),
            ("layer_output_scale.weight", "layer_scalar"),
            ("ffn_gate_inp.weight", "router.proj.weight"),
            ("ffn_gate_inp.scale", "router.scale"),
            ("ffn_down_exps.scale", "router.per_expert_scale"),
            ("ffn_gate_up_exps.weight", "experts.gate_up_proj"),
            ("ffn_down_exps.weight", "experts.down_proj"),
            ("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"),
            ("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"),
            ("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"),
        ];
        for (ours, theirs) in NAMES.iter().filter(|(ours, _)| !ours.is_empty()) {
            if let Some(tensor) = optional(&hf(theirs))? {
                tensors.insert(blk(ours), tensor);
            }
        }
    }
    tensors.insert("output_norm.weight", take("model.norm.weight")?);
    if !config.tie_word_embeddings {
        tensors.insert("output.weight", take("lm_head.weight")?);
    }
    Ok(GgufExport { metadata, tensors, notes: Vec::new() })
}

/// The tokenizer of a SentencePiece-style BPE `tokenizer.json` (byte fallback, spaces as `▁`)
/// as llama.cpp's converter writes Gemma 4's (`tokenizer.ggml.model = gemma4`): the tokens in
/// id order, scores of -1000, their types (byte tokens, control tokens, the rest normal), the
/// merges and the special ids; BOS added, no space prefix.
fn spaced_tokenizer_metadata(
    path: &Path,
    ids: &serde_json::Map<String, serde_json::Value>,
    export: &mut GgufExport,
) -> crate::Result<()> {
    let text = nnx_io::config::read_text(path)?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        problem: crate::error::ConfigProblem::NotModelConfig { message: error.to_string() },
    })?;
    let model = &json["model"];
    if model["type"] != "BPE" || model["byte_fallback"] != true {
        export.notes.push("the tokenizer (not a BPE with byte fallback) is not written".into());
        return Ok(());
    }
    let vocab = model["vocab"].as_object().cloned().unwrap_or_default();
    let added = json["added_tokens"].as_array().cloned().unwrap_or_default();
    let size = vocab
        .values()
        .filter_map(|id| id.as_u64())
        .chain(added.iter().filter_map(|token| token["id"].as_u64()))
        .max()
        .map_or(0, |max| max as usize + 1);
    // llama.cpp's token types: 1 normal, 3 control, 6 byte.
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; size];
    for (token, id) in &vocab {
        if let Some(slot) = id.as_u64().and_then(|id| tokens.get_mut(id as usize)) {
            let byte = token.len() == 6 && token.starts_with("<0x") && token.ends_with('>');
            *slot = Some((token.clone(), if byte { 6 } else { 1 }));
        }
    }
    for token in &added {
        let (Some(id), Some(content)) = (token["id"].as_u64(), token["content"].as_str()) else { continue };
        if token["special"].as_bool() == Some(true)
            && let Some(slot) = tokens.get_mut(id as usize)
        {
            *slot = Some((content.to_string(), 3));
        }
    }
    let (names, kinds): (Vec<String>, Vec<i32>) =
        tokens.into_iter().enumerate().map(|(id, token)| token.unwrap_or_else(|| (format!("[PAD{id}]"), 5))).unzip();
    let merges: Vec<String> = model["merges"]
        .as_array()
        .map(|merges| {
            merges
                .iter()
                .filter_map(|merge| match merge {
                    serde_json::Value::String(text) => Some(text.clone()),
                    serde_json::Value::Array(pair) => {
                        Some(format!("{} {}", pair.first()?.as_str()?, pair.get(1)?.as_str()?))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let scores = vec![-1000.0f32; names.len()];
    let unknown = model["unk_token"].as_str().and_then(|token| vocab.get(token)).and_then(|id| id.as_u64());
    let metadata = &mut export.metadata;
    metadata.set("tokenizer.ggml.model", Value::String("gemma4".into()));
    metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(names)));
    metadata.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(kinds)));
    metadata.set("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    metadata.set("tokenizer.ggml.add_eos_token", Value::Bool(false));
    metadata.set("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    if let Some(id) = unknown {
        metadata.set("tokenizer.ggml.unknown_token_id", Value::U32(id as u32));
    }
    for (key, field) in [("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")] {
        let id = ids.get(key).and_then(|id| id.as_u64().or_else(|| id.as_array()?.first()?.as_u64()));
        if let Some(id) = id {
            metadata.set(format!("tokenizer.ggml.{field}_token_id"), Value::U32(id as u32));
        }
    }
    Ok(())
}

/// The tokenizer of a `tokenizer.json` as llama.cpp's converter writes a byte-level BPE one
/// (`tokenizer.ggml.model = gpt2`): tokens in id order, their types, the merges and the special
/// ids. Other tokenizer models are left out with a note.
fn tokenizer_metadata(
    path: &Path,
    ids: &serde_json::Map<String, serde_json::Value>,
    pre: Option<&str>,
    export: &mut GgufExport,
) -> crate::Result<()> {
    let text = nnx_io::config::read_text(path)?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        problem: crate::error::ConfigProblem::NotModelConfig { message: error.to_string() },
    })?;
    let model = &json["model"];
    let byte_level = json["pre_tokenizer"]["type"] == "ByteLevel"
        || json["pre_tokenizer"]["pretokenizers"]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item["type"] == "ByteLevel"));
    if model["type"] != "BPE" || !byte_level {
        export.notes.push(format!(
            "the tokenizer ({} without a byte-level pre-tokenizer) is not written: only byte-level BPE tokenizers are",
            model["type"].as_str().unwrap_or("unknown")
        ));
        return Ok(());
    }
    let vocab = model["vocab"].as_object().cloned().unwrap_or_default();
    let added = json["added_tokens"].as_array().cloned().unwrap_or_default();
    let size = vocab
        .values()
        .filter_map(|id| id.as_u64())
        .chain(added.iter().filter_map(|token| token["id"].as_u64()))
        .max()
        .map_or(0, |max| max as usize + 1)
        .max(ids.get("vocab_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize);
    let mut tokens = vec![None; size];
    for (token, id) in &vocab {
        if let Some(slot) = id.as_u64().and_then(|id| tokens.get_mut(id as usize)) {
            *slot = Some((token.clone(), 1i32));
        }
    }
    for token in &added {
        let (Some(id), Some(content)) = (token["id"].as_u64(), token["content"].as_str()) else { continue };
        // llama.cpp's token types: 3 control (special), 4 user-defined.
        let kind = if token["special"].as_bool() == Some(true) { 3 } else { 4 };
        if let Some(slot) = tokens.get_mut(id as usize) {
            *slot = Some((content.to_string(), kind));
        }
    }
    let (names, kinds): (Vec<String>, Vec<i32>) =
        tokens.into_iter().enumerate().map(|(id, token)| token.unwrap_or_else(|| (format!("[PAD{id}]"), 5))).unzip();
    let merges: Vec<String> = model["merges"]
        .as_array()
        .map(|merges| {
            merges
                .iter()
                .filter_map(|merge| match merge {
                    serde_json::Value::String(text) => Some(text.clone()),
                    serde_json::Value::Array(pair) => {
                        Some(format!("{} {}", pair.first()?.as_str()?, pair.get(1)?.as_str()?))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let metadata = &mut export.metadata;
    metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    // The pre-tokenizer by its regex where the caller does not name one: Qwen's splits with
    // `\p{M}` (Qwen3.5's) or without (Qwen2's).
    let pattern = json["pre_tokenizer"]["pretokenizers"]
        .as_array()
        .and_then(|items| items.iter().find_map(|item| item["pattern"]["Regex"].as_str()))
        .unwrap_or_default();
    let pre = pre.unwrap_or(match pattern {
        _ if pattern.contains("\\p{M}") => "qwen35",
        _ if pattern.contains("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+") => "qwen2",
        _ => "default",
    });
    metadata.set("tokenizer.ggml.pre", Value::String(pre.into()));
    metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(names)));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(kinds)));
    // llama.cpp requires the key for byte-level BPE even when there are no merges.
    metadata.set("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    // Whether encoding adds BOS or EOS, as the post-processor's single-sequence template says.
    let single = json["post_processor"]["single"].as_array().cloned().unwrap_or_default();
    let special = |item: Option<&serde_json::Value>| item.is_some_and(|item| item.get("SpecialToken").is_some());
    metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(special(single.first())));
    metadata.set("tokenizer.ggml.add_eos_token", Value::Bool(single.len() > 1 && special(single.last())));
    for (key, field) in [("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")] {
        if let Some(id) = ids.get(key).and_then(|id| id.as_u64()) {
            metadata.set(format!("tokenizer.ggml.{field}_token_id"), Value::U32(id as u32));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_interleaved_within_each_head() {
        // Two heads of four rows: [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let weight = Tensor::from_vec((0..8).map(|i| i as f32).collect::<Vec<_>>(), &[8, 1]).unwrap();
        let permuted = permute_rows(&weight, 2).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(permuted, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
    }
}
