//! LoRA adapters made by PEFT 0.21, MLX-LM and llama.cpp's converter (`tests/fixtures/lora/`,
//! made by `scripts/lora/make_goldens.sh`) merged into nnx's Llama and GPT-2: merged weights
//! against the references' own merges, logits against theirs, strict reports and errors.

use std::collections::HashMap;
use std::path::PathBuf;

use nnx::adapter::{Adapter, AdapterFormat, AdapterProblem, LoraKind};
use nnx::models::Dense;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::models::lora::{Lora, LoraLayers, Switches};
use nnx::nn::Init;
use nnx::{Archive, DType, ImportOp, Naming, Tensor};
use serde_json::Value;

use crate::util::{fixtures, floats, ids, max_abs_diff};

fn case(name: &str) -> PathBuf {
    fixtures().join("lora").join(name)
}

fn expected(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(case(name).join("expected.json")).unwrap()).unwrap()
}

/// The llama3 fixture's folder in f32 (the base the PEFT goldens were merged into).
fn llama() -> Llama {
    let dir = fixtures().join("models").join("llama3");
    let mut model = Llama::new(&LlamaConfig::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    Archive::open(dir.join("model.safetensors")).unwrap().import_into(&mut model, "").unwrap();
    model
}

fn gpt2() -> Gpt2 {
    let dir = fixtures().join("gpt2-tiny");
    let mut model = Gpt2::new(&Gpt2Config::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    Archive::open(dir.join("model.safetensors")).unwrap().import_into(&mut model, "").unwrap();
    model
}

/// `tensor` read the way a model reads its source entry through `ops`.
fn through(tensor: &Tensor, ops: &[ImportOp]) -> Tensor {
    let mut tensor = tensor.clone();
    for op in ops {
        tensor = match op {
            ImportOp::Split(split) => {
                let axis = if split.axis < 0 { tensor.rank() as isize + split.axis } else { split.axis } as usize;
                let piece = tensor.shape()[axis] / split.parts;
                tensor.narrow(axis, split.index * piece, piece).unwrap()
            }
            ImportOp::Transpose if tensor.rank() == 2 => tensor.transpose(0, 1).unwrap(),
            _ => tensor,
        };
    }
    tensor.contiguous()
}

/// Every tensor of `merged.safetensors` (source names) against what `model` holds for it;
/// returns how many model tensors were compared.
fn assert_merged_weights<M: nnx::Module>(model: &M, name: &str, tolerance: f32) -> usize {
    let golden = Archive::open(case(name).join("merged.safetensors")).unwrap();
    let mut held: HashMap<String, Vec<(Vec<ImportOp>, Tensor)>> = HashMap::new();
    nnx::for_each_entry_named(model, Naming::Transformers, |slot, tensor| {
        if slot.tie.is_none() {
            held.entry(slot.source.to_string()).or_default().push((slot.ops.to_vec(), tensor.clone()));
        }
    });
    let mut compared = 0;
    for entry in golden.names() {
        let targets = held.get(entry).unwrap_or_else(|| panic!("{name}: no model tensor reads `{entry}`"));
        let reference = golden.try_get(entry).unwrap();
        for (ops, tensor) in targets {
            let expected = through(&reference, ops).to_vec::<f32>().unwrap();
            let ours = tensor.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let diff = max_abs_diff(&ours, &expected, entry);
            assert!(diff <= tolerance, "{name}: `{entry}` differs from the reference merge by {diff}");
            compared += 1;
        }
    }
    compared
}

#[test]
fn peft_llama_adapters_merge_as_peft_merges_them() {
    for name in ["llama-lora", "llama-rslora", "llama-dora", "llama-embed"] {
        let reference = expected(name);
        let adapter = Adapter::open(case(name)).unwrap();
        assert_eq!(adapter.format, AdapterFormat::Peft);
        // Scales from `r`, `lora_alpha`, rsLoRA and the rank and alpha patterns, as PEFT used.
        for module in &adapter.modules {
            let scale = reference["scaling"][&module.source].as_f64().unwrap() as f32;
            assert!((module.scale - scale).abs() <= 1e-6 * scale, "{name}: {} scale {}", module.source, module.scale);
        }
        let mut model = llama();
        let before = model.clone();
        let merged = adapter.merge_into(&mut model).unwrap();
        assert!(merged.report.problems.is_empty());
        let compared = assert_merged_weights(&model, name, 2e-6);
        let mut changed: Vec<&String> = merged.report.matched.iter().chain(&merged.report.replaced).collect();
        changed.sort();
        changed.dedup();
        assert_eq!(compared, changed.len(), "{name}");

        let ids = ids(&reference["ids"]);
        let logits = model.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), name);
        assert!(diff < 1e-4, "{name}: merged logits differ from PEFT's by {diff}");
        let diff = max_abs_diff(&logits, &floats(&reference["logits_unmerged"]), name);
        assert!(diff < 1e-4, "{name}: merged logits differ from PEFT's unmerged forward by {diff}");

        // Unmerging puts back the very tensors the model had.
        merged.unmerge(&mut model);
        nnx::for_each_entry(&model, |slot, tensor| {
            let mut original = None;
            nnx::for_each_entry(&before, |other, value| {
                if other.name == slot.name {
                    original = Some(value.to_bytes().unwrap().into_owned());
                }
            });
            assert_eq!(tensor.to_bytes().unwrap().into_owned(), original.unwrap(), "{name}: {}", slot.name);
        });
    }
}

#[test]
fn peft_features_are_read_from_the_files() {
    let rslora = Adapter::open(case("llama-rslora")).unwrap();
    // A regex `target_modules`, one match excluded, rank 8 and alpha 16.0 under rsLoRA.
    assert_eq!(rslora.modules.len(), 5);
    assert!(rslora.modules.iter().all(|module| (module.scale - 16.0 / 8f32.sqrt()).abs() < 1e-6));
    assert!(!rslora.modules.iter().any(|module| module.source == "model.layers.1.mlp.down_proj"));
    let patterns = Adapter::open(case("llama-patterns")).unwrap();
    assert_eq!(patterns.ranks(), (2, 4));
    assert!(patterns.modules.iter().all(|module| module.bias.is_some()), "lora_bias");
    let dora = Adapter::open(case("llama-dora")).unwrap();
    for module in &dora.modules {
        // One magnitude per output row: 64 for q and o, 32 for v (2 key/value heads of 16).
        let rows = module.b.shape()[0];
        assert_eq!(module.magnitude.as_ref().map(|m| m.shape().to_vec()), Some(vec![rows]), "{}", module.source);
    }
    let embed = Adapter::open(case("llama-embed")).unwrap();
    let table = embed.modules.iter().find(|module| module.source == "model.embed_tokens").unwrap();
    assert_eq!((table.kind, table.a.shape(), table.b.shape()), (LoraKind::Lookup, &[4, 320][..], &[64, 4][..]));
    assert_eq!(embed.saved.keys().collect::<Vec<_>>(), ["lm_head.weight", "model.embed_tokens.weight"]);
    let gpt2 = Adapter::open(case("gpt2-conv1d")).unwrap();
    assert!(gpt2.modules.iter().all(|module| module.fan_in_fan_out));
}

/// The llama3 fixture's weights as f32 entries under their own names.
fn llama_f32_archive() -> Archive {
    let source = Archive::open(fixtures().join("models").join("llama3").join("model.safetensors")).unwrap();
    let mut archive = Archive::new();
    for name in source.names() {
        let shape = source.info(name).unwrap().shape;
        archive.insert(name, source.float(name, DType::F32, &shape).unwrap());
    }
    archive
}

#[test]
fn trained_biases_are_added_to_the_files_and_refused_by_a_model_without_biases() {
    // `lora_bias` on Llama's bias-free MLP: PEFT's merge gives the layers biases, and so does
    // merging into the files; nnx's Llama has no bias there, so merging into it is refused.
    let name = "llama-patterns";
    let adapter = Adapter::open(case(name)).unwrap();
    let merged = adapter.merge_archive(&llama_f32_archive()).unwrap();
    let golden = Archive::open(case(name).join("merged.safetensors")).unwrap();
    for entry in golden.names() {
        let ours = merged.try_get(entry).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&ours, &golden.try_get(entry).unwrap().to_vec::<f32>().unwrap(), entry);
        assert!(diff <= 2e-6, "`{entry}` differs from PEFT's merge by {diff}");
    }
    let report = adapter.check(&llama());
    assert_eq!(report.problems.len(), 6, "{:?}", report.problems);
    assert!(report.problems.iter().all(|problem| problem.to_string().contains("trained a bias")));
    assert_eq!(report.matched.len(), 6, "the weights fit");
}

#[test]
fn a_conv1d_adapter_lands_on_the_split_and_transposed_fields() {
    let name = "gpt2-conv1d";
    let reference = expected(name);
    let adapter = Adapter::open(case(name)).unwrap();
    let mut model = gpt2();
    let merged = adapter.merge_into(&mut model).unwrap();
    // c_attn feeds q, k and v: one module, three model tensors per layer.
    assert!(merged.report.matched.iter().any(|name| name == "h.0.attn.k.weight"), "{:?}", merged.report.matched);
    assert_merged_weights(&model, name, 2e-6);
    let logits = model.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), name);
    assert!(diff < 1e-4, "GPT-2 merged logits differ from PEFT's by {diff}");
}

#[test]
fn mlx_adapters_merge_as_mlx_lm_fuses_them() {
    let name = "mlx-lora";
    let reference = expected(name);
    let adapter = Adapter::open(case(name)).unwrap();
    assert_eq!(adapter.format, AdapterFormat::Mlx);
    assert!(adapter.modules.iter().all(|module| module.scale == 20.0 && module.rank() == 4));
    let mut model = llama();
    adapter.merge_into(&mut model).unwrap();
    assert_merged_weights(&model, name, 2e-6);
    let logits = model.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&logits, &floats(&reference["logits_merged_transformers"]), name);
    assert!(diff < 1e-4, "MLX merged logits differ by {diff}");
}

#[test]
fn mlx_adapters_of_gpt2_merge_into_its_conv1d_weights() {
    // mlx-lm turns GPT-2's `Conv1D` weights (stored `[in, out]`) to `[out, in]` when it loads
    // them and names its modules under `model.`: the PEFT adapter's factors written as mlx-lm
    // writes them (`lora_a` = A^T `[in, r]`, `lora_b` = B^T `[r, out]`, scale alpha / r) must
    // merge into the stored checkpoint as PEFT's `fan_in_fan_out` merge does.
    let name = "gpt2-conv1d";
    let reference = expected(name);
    let peft = Archive::open(case(name).join("adapter_model.safetensors")).unwrap();
    let mut mlx = Archive::new();
    for entry in peft.names() {
        let stem = entry.strip_prefix("base_model.model.transformer.").unwrap();
        let (module, factor) = stem.strip_suffix(".weight").unwrap().rsplit_once('.').unwrap();
        let factor = if factor == "lora_A" { "lora_a" } else { "lora_b" };
        let turned = peft.try_get(entry).unwrap().transpose(0, 1).unwrap().contiguous();
        mlx.insert(format!("model.{module}.{factor}"), turned);
    }
    let dir = crate::util::scratch();
    mlx.save(dir.path().join("adapters.safetensors")).unwrap();
    let config = serde_json::json!({
        "fine_tune_type": "lora",
        "num_layers": 2,
        "lora_parameters": {"rank": 4, "scale": 4.0, "dropout": 0.0, "keys": ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]},
    });
    std::fs::write(dir.path().join("adapter_config.json"), config.to_string()).unwrap();

    let adapter = Adapter::open(dir.path()).unwrap();
    assert_eq!(adapter.format, AdapterFormat::Mlx);
    let mut model = gpt2();
    let merged = adapter.merge_into(&mut model).unwrap();
    assert!(merged.report.matched.iter().any(|name| name == "h.1.attn.v.weight"), "{:?}", merged.report.matched);
    assert_merged_weights(&model, name, 2e-6);
    let logits = model.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), name);
    assert!(diff < 1e-4, "GPT-2 merged with the MLX adapter differs from PEFT's merge by {diff}");
}

#[test]
fn gguf_adapters_merge_into_the_gguf_base_as_peft_merges_the_same_factors() {
    // llama.cpp's converter made this file from `llama-lora`'s PEFT adapter.
    let adapter = Adapter::open(case("gguf-lora").join("adapter.gguf")).unwrap();
    assert_eq!(adapter.format, AdapterFormat::Gguf);
    assert_eq!(adapter.modules.len(), 14);
    assert!(adapter.modules.iter().all(|module| module.scale == 2.0));
    let base = Archive::open(fixtures().join("models").join("llama3").join("model-f32.gguf")).unwrap();
    let merged = adapter.merge_archive(&base).unwrap();
    // The merged file imports like any GGUF Llama (q and k rows put back in transformers' order).
    let dir = fixtures().join("models").join("llama3");
    let mut model = Llama::new(&LlamaConfig::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    merged.import_into_with(&mut model, "", &nnx::ImportOptions::default().with_naming(Naming::Gguf)).unwrap();
    assert_merged_weights(&model, "llama-lora", 2e-6);
    let reference = expected("llama-lora");
    let logits = model.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), "gguf");
    assert!(diff < 1e-4, "GGUF-merged logits differ from PEFT's by {diff}");
}

#[test]
fn an_adapter_for_another_model_is_refused_whole_with_every_problem_named() {
    // A Llama adapter on GPT-2: nothing matches, and nothing changes.
    let adapter = Adapter::open(case("llama-lora")).unwrap();
    let mut model = gpt2();
    let before = model.h[0].attn.q.weight.to_vec::<f32>().unwrap();
    let report = adapter.check(&model);
    assert_eq!(report.problems.len(), 14);
    assert!(report.matched.is_empty());
    let error = adapter.merge_into(&mut model).unwrap_err().to_string();
    assert!(
        error.contains("does not fit `Gpt2`")
            && error.contains("model.layers.0.self_attn.q_proj.weight` has no target"),
        "{error}"
    );
    assert_eq!(model.h[0].attn.q.weight.to_vec::<f32>().unwrap(), before);

    // A near-miss name is suggested; a shape that does not fit is named with both shapes.
    let mut wide = llama();
    wide.layers[1].attn.o.weight = Tensor::zeros(DType::F32, &[64, 32]);
    let report = adapter.check(&wide);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(
        report.problems[0],
        AdapterProblem::Shape {
            module: "model.layers.1.self_attn.o_proj.weight".into(),
            target: "layers.1.attn.o.weight".into(),
            expected: vec![64, 32],
            found: vec![64, 64],
        }
    );
}

#[test]
fn peft_files_with_another_prefix_are_refused_by_name() {
    // PEFT's own merge silently does nothing for such keys; nnx names the entry.
    let dir = crate::util::scratch();
    std::fs::copy(case("llama-lora").join("adapter_config.json"), dir.path().join("adapter_config.json")).unwrap();
    let source = Archive::open(case("llama-lora").join("adapter_model.safetensors")).unwrap();
    let mut renamed = Archive::new();
    for name in source.names() {
        renamed.insert(name.replace("base_model.model.", "base_model.model.model."), source.try_get(name).unwrap());
    }
    renamed.save(dir.path().join("adapter_model.safetensors")).unwrap();
    let adapter = Adapter::open(dir.path()).unwrap();
    let error = adapter.merge_into(&mut llama()).unwrap_err().to_string();
    assert!(error.contains("model.model.layers.0.self_attn.q_proj.weight` has no target"), "{error}");

    let mut unprefixed = Archive::new();
    for name in source.names() {
        unprefixed.insert(name.trim_start_matches("base_model.model."), source.try_get(name).unwrap());
    }
    unprefixed.save(dir.path().join("adapter_model.safetensors")).unwrap();
    let error = Adapter::open(dir.path()).unwrap_err().to_string();
    assert!(error.contains("does not start with `base_model.model.`"), "{error}");
}

#[test]
fn nnx_lora_merge_writes_a_folder_that_loads_as_the_merged_model() {
    let dir = crate::util::scratch();
    let out = dir.path().join("merged");
    let status = std::process::Command::new(crate::util::nnx_binary())
        .args(["lora", "merge"])
        .arg(fixtures().join("models").join("llama3"))
        .arg(case("llama-lora"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert!(out.join("config.json").is_file() && out.join("tokenizer.json").is_file());
    let loaded = nnx::models::load(out.to_str().unwrap()).unwrap();
    let reference = expected("llama-lora");
    let logits = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    // The folder keeps the base's BF16: the merged weights are rounded to it.
    let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), "merged folder");
    assert!(diff < 0.1, "the merged folder's logits differ from PEFT's f32 merge by {diff}");

    let inspect = std::process::Command::new(crate::util::nnx_binary())
        .args(["lora", "inspect"])
        .arg(case("llama-patterns"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("format   PEFT") && text.contains("rank     2-4") && text.contains("bias"), "{text}");
}

#[test]
fn adapters_save_in_peft_layout_and_read_back_the_same() {
    let dir = crate::util::scratch();
    // MLX-LM's factors as a PEFT adapter: merged, they are still mlx_lm's fuse.
    let mlx = Adapter::open(case("mlx-lora")).unwrap();
    mlx.save_peft(dir.path().join("from-mlx")).unwrap();
    let peft = Adapter::open(dir.path().join("from-mlx")).unwrap();
    assert_eq!(peft.format, AdapterFormat::Peft);
    let mut model = llama();
    peft.merge_into(&mut model).unwrap();
    assert_merged_weights(&model, "mlx-lora", 2e-6);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("from-mlx/adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!((config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some(4), Some(80.0)));
    assert_eq!(config["target_modules"], serde_json::json!(["down_proj", "q_proj", "v_proj"]));

    // Ranks, scales, biases, DoRA magnitudes and saved modules all come back.
    for name in ["llama-patterns", "llama-dora", "llama-embed", "gpt2-conv1d"] {
        let original = Adapter::open(case(name)).unwrap();
        original.save_peft(dir.path().join(name)).unwrap();
        let again = Adapter::open(dir.path().join(name)).unwrap();
        assert_eq!(again.modules.len(), original.modules.len(), "{name}");
        for (a, b) in original.modules.iter().zip(&again.modules) {
            assert_eq!(
                (&a.source, a.kind, a.rank(), a.fan_in_fan_out),
                (&b.source, b.kind, b.rank(), b.fan_in_fan_out)
            );
            assert!((a.scale - b.scale).abs() <= 1e-6 * a.scale, "{name} {}: {} vs {}", a.source, a.scale, b.scale);
            assert_eq!(a.delta().unwrap().to_vec::<f32>().unwrap(), b.delta().unwrap().to_vec::<f32>().unwrap());
            assert_eq!(a.magnitude.is_some(), b.magnitude.is_some());
            assert_eq!(a.bias.is_some(), b.bias.is_some());
        }
        assert_eq!(again.saved.keys().collect::<Vec<_>>(), original.saved.keys().collect::<Vec<_>>(), "{name}");
    }
    let gguf = Adapter::open(case("gguf-lora").join("adapter.gguf")).unwrap();
    let error = gguf.save_peft(dir.path().join("gguf")).unwrap_err().to_string();
    assert!(error.contains("llama.cpp's tensor names"), "{error}");
}

#[test]
fn nnx_run_with_lora_runs_the_merged_model() {
    let dir = crate::util::scratch();
    let base = fixtures().join("models").join("llama3");
    let merged = dir.path().join("merged");
    let nnx = |args: &[&std::ffi::OsStr]| {
        let output = std::process::Command::new(crate::util::nnx_binary()).args(args).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let adapter = case("llama-lora");
    nnx(&["lora".as_ref(), "merge".as_ref(), base.as_os_str(), adapter.as_os_str(), merged.as_os_str()]);
    let run = |model: &std::path::Path, lora: Option<String>| {
        let mut args: Vec<std::ffi::OsString> = vec!["run".into(), model.into()];
        for arg in ["--prompt", "hello", "--max-new-tokens", "6", "--temperature", "0", "--json"] {
            args.push(arg.into());
        }
        if let Some(lora) = lora {
            args.extend(["--lora".into(), lora.into()]);
        }
        let text = nnx(&args.iter().map(|arg| arg.as_os_str()).collect::<Vec<_>>());
        let value: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        value["generated_ids"].clone()
    };
    let with_lora = run(&base, Some(adapter.display().to_string()));
    assert_eq!(with_lora, run(&merged, None), "--lora runs what `lora merge` writes");
    assert_ne!(with_lora, run(&base, None), "the adapter changes the text");
    assert_eq!(run(&base, Some(format!("{}:0", adapter.display()))), run(&base, None), "scale 0 is the base");
}

#[test]
fn gguf_models_take_adapters_at_run_time() {
    // A GGUF model keeps its blocks; PEFT's and llama.cpp's adapters are applied beside them
    // (PEFT's renamed to the file's names and q/k row order on the way).
    let models = fixtures().join("models").join("llama3");
    let reference = expected("llama-lora");
    let ids = ids(&reference["ids"]);
    let logits = |file: &str, adapter: PathBuf, scale: f32| {
        let options = nnx::models::LoadOptions::default().adapter(Adapter::open(adapter).unwrap(), scale);
        let loaded = nnx::models::load_with(models.join(file).to_str().unwrap(), &options).unwrap();
        loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap()
    };
    for adapter in [case("llama-lora"), case("gguf-lora").join("adapter.gguf")] {
        let diff = max_abs_diff(
            &logits("model-f32.gguf", adapter.clone(), 1.0),
            &floats(&reference["logits_unmerged"]),
            "gguf",
        );
        assert!(diff < 1e-4, "{}: run-time logits on the GGUF file differ from PEFT's by {diff}", adapter.display());
    }
    let base = nnx::models::load(models.join("model-q8_0.gguf").to_str().unwrap()).unwrap().model.logits(&ids).unwrap();
    assert_eq!(logits("model-q8_0.gguf", case("llama-lora"), 0.0), base.to_vec::<f32>().unwrap(), "scale 0");

    // `nnx run` takes them the same way.
    let output = std::process::Command::new(crate::util::nnx_binary())
        .args(["run", "--prompt", "hi", "--max-new-tokens", "3", "--temperature", "0", "--json", "--lora"])
        .arg(case("llama-lora"))
        .arg(models.join("model-q8_0.gguf"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `model` with `adapters` applied at run time (no weight changed), and their switches.
fn with_runtime_adapters(
    model: &Llama,
    adapters: &[&Adapter],
    stored: bool,
) -> (Llama<nnx::Host, Lora<Dense>>, Switches) {
    let layers = LoraLayers::new(model, adapters, stored).unwrap();
    let wrapped = model.map_weights::<Lora<Dense>>(|path, layer| Ok(layers.layer(path, layer))).unwrap();
    (wrapped, layers.switches())
}

#[test]
fn adapters_applied_at_run_time_give_peft_unmerged_logits_and_switch_exactly() {
    let base = llama();
    let ids_of = |name: &str| ids(&expected(name)["ids"]);
    let base_logits = base.forward(&ids_of("llama-lora")).unwrap().to_vec::<f32>().unwrap();
    for name in ["llama-lora", "llama-rslora", "llama-patterns", "mlx-lora"] {
        let adapter = Adapter::open(case(name)).unwrap();
        let (model, switches) = with_runtime_adapters(&base, &[&adapter], false);
        let logits = model.forward(&ids_of(name)).unwrap().to_vec::<f32>().unwrap();
        let key = if name == "mlx-lora" { "logits_merged_transformers" } else { "logits_unmerged" };
        let diff = max_abs_diff(&logits, &floats(&expected(name)[key]), name);
        assert!(diff < 1e-4, "{name}: run-time adapter logits differ from the reference by {diff}");
        // Off is the base exactly: its weights were never touched.
        switches.set(0, 0.0);
        if name != "mlx-lora" {
            let off = model.forward(&ids_of(name)).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(off, base.forward(&ids_of(name)).unwrap().to_vec::<f32>().unwrap(), "{name} off");
        }
    }

    // Two adapters at once, switched without reloading.
    let (lora, rslora) = (Adapter::open(case("llama-lora")).unwrap(), Adapter::open(case("llama-rslora")).unwrap());
    let (model, switches) = with_runtime_adapters(&base, &[&lora, &rslora], false);
    assert_eq!(model.layers[0].attn.q.adapters(), 2);
    let ids = ids_of("llama-lora");
    let mut both_merged = base.clone();
    lora.merge_into(&mut both_merged).unwrap();
    rslora.merge_into(&mut both_merged).unwrap();
    let both = model.forward(&ids).unwrap().to_vec::<f32>().unwrap();
    let merged = both_merged.forward(&ids).unwrap().to_vec::<f32>().unwrap();
    assert!(max_abs_diff(&both, &merged, "both") < 1e-4);
    switches.set(1, 0.0);
    let first = model.forward(&ids).unwrap().to_vec::<f32>().unwrap();
    assert!(max_abs_diff(&first, &floats(&expected("llama-lora")["logits_unmerged"]), "first") < 1e-4);
    switches.set(0, 0.0);
    assert_eq!(model.forward(&ids).unwrap().to_vec::<f32>().unwrap(), base_logits, "both off");
    assert_eq!(switches.get(), [0.0, 0.0]);

    // DoRA and embedding factors only merge: attaching them is refused by name.
    let error = LoraLayers::new(&base, &[&Adapter::open(case("llama-dora")).unwrap()], false).unwrap_err().to_string();
    assert!(error.contains("DoRA") && error.contains("merge it instead"), "{error}");
}

#[test]
fn a_gguf_adapter_runs_on_a_model_that_keeps_the_gguf_rows() {
    // The GGUF base and adapter both hold q and k in llama.cpp's rotary order: a model that
    // keeps that order (as the loader's GGUF Llama does) takes the factors as they are.
    let dir = fixtures().join("models").join("llama3");
    let mut model = Llama::new(&LlamaConfig::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    model.stored_rope_rows = true;
    let options = nnx::ImportOptions::default().with_stored_rope_rows();
    Archive::open(dir.join("model-f32.gguf")).unwrap().import_into_with(&mut model, "", &options).unwrap();
    let adapter = Adapter::open(case("gguf-lora").join("adapter.gguf")).unwrap();
    let (wrapped, _) = with_runtime_adapters(&model, &[&adapter], true);
    let reference = expected("llama-lora");
    let logits = wrapped.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&logits, &floats(&reference["logits_unmerged"]), "gguf run time");
    assert!(diff < 1e-4, "a GGUF adapter on the GGUF model differs from PEFT by {diff}");
    // The same model without that promise is refused: its rows would be reordered.
    let error = LoraLayers::new(&model, &[&adapter], false).unwrap_err().to_string();
    assert!(error.contains("rotary order"), "{error}");
}

#[test]
fn peft_adapters_renamed_for_gguf_equal_llama_cpps_conversion() {
    // nnx's renaming of the PEFT adapter (names and q/k rows of B) against what llama.cpp's
    // `convert_lora_to_gguf.py` wrote from the same adapter.
    let base = Archive::open(fixtures().join("models").join("llama3").join("model-f32.gguf")).unwrap();
    let metadata = base.gguf_metadata().unwrap();
    let model =
        Llama::new(&LlamaConfig::from_gguf(metadata, !base.contains("output.weight")).unwrap(), DType::F32, Init::Meta);
    let renamed = Adapter::open(case("llama-lora")).unwrap().renamed_for_gguf(&model, metadata).unwrap();
    let converted = Adapter::open(case("gguf-lora").join("adapter.gguf")).unwrap();
    let by_name: HashMap<&str, _> = converted.modules.iter().map(|module| (module.source.as_str(), module)).collect();
    assert_eq!(renamed.modules.len(), by_name.len());
    for module in &renamed.modules {
        let theirs = by_name[module.source.as_str()];
        assert_eq!(module.a.to_vec::<f32>().unwrap(), theirs.a.to_vec::<f32>().unwrap(), "{}: A", module.source);
        assert_eq!(module.b.to_vec::<f32>().unwrap(), theirs.b.to_vec::<f32>().unwrap(), "{}: B", module.source);
        assert_eq!(module.scale, theirs.scale);
    }
}

#[test]
fn nnx_lora_merge_writes_gguf_files_that_run_as_the_merged_model() {
    let dir = crate::util::scratch();
    let models = fixtures().join("models").join("llama3");
    let reference = expected("llama-lora");
    let ids = ids(&reference["ids"]);
    // Q8_0's own rounding on these ids: the Q8_0 base against the F32 base.
    let logits_of = |path: PathBuf| {
        nnx::models::load(path.to_str().unwrap()).unwrap().model.logits(&ids).unwrap().to_vec::<f32>().unwrap()
    };
    let rounding =
        max_abs_diff(&logits_of(models.join("model-q8_0.gguf")), &logits_of(models.join("model-f32.gguf")), "q8_0");
    for (base, adapter, tolerance) in [
        ("model-f32.gguf", case("gguf-lora").join("adapter.gguf"), 1e-4),
        ("model-f32.gguf", case("llama-lora"), 1e-4),
        // Each merged Q8_0 tensor is encoded again: the logits keep Q8_0's rounding.
        ("model-q8_0.gguf", case("llama-lora"), rounding),
    ] {
        let out = dir.path().join(format!("{base}-{}.gguf", adapter.file_name().unwrap().to_string_lossy()));
        let output = std::process::Command::new(crate::util::nnx_binary())
            .args(["lora", "merge"])
            .arg(models.join(base))
            .arg(&adapter)
            .arg(&out)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let (original, merged) = (Archive::open(models.join(base)).unwrap(), Archive::open(&out).unwrap());
        for name in original.names() {
            assert_eq!(merged.ggml_type(name), original.ggml_type(name), "{base}: `{name}` keeps its type");
        }
        // A merged tensor is the base's decoded values plus the delta, encoded again.
        let renamed = case("gguf-lora").join("adapter.gguf");
        let delta = Adapter::open(&renamed)
            .unwrap()
            .modules
            .iter()
            .find(|m| m.source == "blk.1.ffn_up")
            .unwrap()
            .delta()
            .unwrap();
        let stored = original.ggml("blk.1.ffn_up.weight").unwrap();
        let values: Vec<f32> = stored
            .dequantize()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .zip(delta.to_vec::<f32>().unwrap())
            .map(|(w, d)| w + d)
            .collect();
        let expected_blocks =
            nnx::gguf::GgmlTensor::quantize(&Tensor::from_vec(values, &stored.shape).unwrap(), stored.ty).unwrap();
        assert_eq!(
            merged.ggml("blk.1.ffn_up.weight").unwrap().bytes().unwrap(),
            expected_blocks.bytes().unwrap(),
            "{base}"
        );
        let logits = logits_of(out.clone());
        let diff = max_abs_diff(&logits, &floats(&reference["logits_merged"]), base);
        assert!(diff < tolerance, "{base} + {}: logits differ from PEFT's merge by {diff}", adapter.display());
    }
}

#[test]
fn adapters_come_from_the_hub_and_then_its_cache() {
    use crate::hub_server::{Access, FakeHub};
    let server = FakeHub::start();
    server.create_repo("org/lora", Access::Public);
    let files: Vec<(&str, Vec<u8>)> = ["adapter_config.json", "adapter_model.safetensors", "README.md"]
        .into_iter()
        .map(|name| {
            let bytes = if name == "README.md" {
                b"a card".to_vec()
            } else {
                std::fs::read(case("llama-lora").join(name)).unwrap()
            };
            (name, bytes)
        })
        .collect();
    let list: Vec<(&str, &[u8])> = files.iter().map(|(name, bytes)| (*name, bytes.as_slice())).collect();
    server.commit("org/lora", "main", &list);
    let cache = crate::util::scratch();
    let inspect = |offline: bool| {
        let mut command = std::process::Command::new(crate::util::nnx_binary());
        command.args(["lora", "inspect", "hf://org/lora"]).env_remove("HF_TOKEN").env_remove("HF_HUB_OFFLINE");
        for (key, value) in crate::hub::hub_env(&server, cache.path()) {
            command.env(key, value);
        }
        if offline {
            command.env("HF_HUB_OFFLINE", "1");
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let online = inspect(false);
    assert!(online.contains("format   PEFT") && online.contains("modules  14 adapted"), "{online}");
    // Offline, the cache answers with the same adapter.
    assert_eq!(inspect(true).lines().skip(1).collect::<Vec<_>>(), online.lines().skip(1).collect::<Vec<_>>());
}

#[test]
fn mlx_affine_bases_take_adapters_as_mlx_lm_fuses_them() {
    // mlx_lm's fuse on a 4-bit base: each target decoded, the delta added in BF16 and the sum
    // quantized again; nnx writes the same words, scales and biases.
    let dir = case("mlx-affine");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let adapter = Adapter::open(case("mlx-lora")).unwrap();
    let base = Archive::open(dir.join("base")).unwrap();
    let merged = adapter.merge_archive(&base).unwrap();
    let fused = Archive::open(dir.join("fused")).unwrap();
    let changed: Vec<&str> =
        reference["fused_tensors"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(changed.len(), 18);
    for name in fused.names() {
        let (ours, theirs) = (merged.try_get(name).unwrap(), fused.try_get(name).unwrap());
        assert_eq!(ours.to_bytes().unwrap(), theirs.to_bytes().unwrap(), "`{name}` differs from mlx_lm's fuse");
    }
    // And the folder runs with the adapter merged at load, as mlx_lm's fused folder runs.
    let ids = ids(&reference["ids"]);
    let options = nnx::models::LoadOptions::default().adapter(adapter, 1.0);
    let loaded = nnx::models::load_with(dir.join("base").to_str().unwrap(), &options).unwrap();
    assert!(loaded.weights.starts_with("mlx affine 4-bit"), "{}", loaded.weights);
    let logits = loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    let theirs = nnx::models::load(dir.join("fused").to_str().unwrap()).unwrap().model.logits(&ids).unwrap();
    assert_eq!(logits, theirs.to_vec::<f32>().unwrap());
    // nnx computes in f32 over MLX's BF16 weights: between mlx's BF16 run and its f32 one.
    let (bf16, f32) = (floats(&reference["logits_fused"]), floats(&reference["logits_fused_f32"]));
    let spread = max_abs_diff(&bf16, &f32, "mlx");
    assert!(max_abs_diff(&logits, &f32, "f32") < spread && max_abs_diff(&logits, &bf16, "bf16") < spread);
}

#[test]
fn peft_adapters_saved_as_pytorch_checkpoints_read_the_same() {
    // PEFT's `safe_serialization=False` layout: `adapter_model.bin`, read without running code.
    let (bin, safetensors) =
        (Adapter::open(case("llama-lora-bin")).unwrap(), Adapter::open(case("llama-lora")).unwrap());
    assert_eq!(bin.modules.len(), safetensors.modules.len());
    let by_name: HashMap<&str, _> = safetensors.modules.iter().map(|module| (module.source.as_str(), module)).collect();
    for a in &bin.modules {
        let b = by_name[a.source.as_str()];
        assert_eq!(a.scale, b.scale);
        assert_eq!(a.a.to_vec::<f32>().unwrap(), b.a.to_vec::<f32>().unwrap());
        assert_eq!(a.b.to_vec::<f32>().unwrap(), b.b.to_vec::<f32>().unwrap());
    }
}

#[test]
fn lora_on_a_mixture_of_experts_adapts_attention_beside_gguf_stacks_and_experts_merged_into_folders() {
    let models = fixtures().join("models").join("qwen3moe");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(models.join("reference.json")).unwrap()).unwrap();
    let ids = ids(&reference["ids"]);
    let dir = crate::util::scratch();
    let logits = |model: &std::path::Path, adapter: Option<&std::path::Path>| {
        let mut options = nnx::models::LoadOptions::default();
        if let Some(adapter) = adapter {
            options = options.adapter(Adapter::open(adapter).unwrap(), 1.0);
        }
        let loaded = nnx::models::load_with(model.to_str().unwrap(), &options)?;
        loaded.model.logits(&ids)?.to_vec::<f32>()
    };
    // The folder in F32 (its BF16 values widened), so that merged and run-time products round alike;
    // `edit` changes one weight of the copy.
    let folder = |name: &str, edit: &dyn Fn(&str, Vec<f32>) -> Vec<f32>| {
        let out = dir.path().join(name);
        std::fs::create_dir(&out).unwrap();
        for file in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(models.join(file), out.join(file)).unwrap();
        }
        let source = Archive::open(models.join("model.safetensors")).unwrap();
        let mut widened = Archive::new();
        for name in source.names().map(str::to_string).collect::<Vec<_>>() {
            let tensor = source.get(&name).unwrap().to_dtype(DType::F32).unwrap();
            let values = edit(&name, tensor.to_vec::<f32>().unwrap());
            widened.insert(&name, Tensor::from_vec(values, tensor.shape()).unwrap());
        }
        widened.save(out.join("model.safetensors")).unwrap();
        out
    };
    // PEFT adapters of rank 4, alpha 8 (scale 2), with fixed factors on one module.
    const RANK: usize = 4;
    let factor = |len: usize, seed: f32| (0..len).map(|i| 0.05 * (i as f32 * 0.37 + seed).sin()).collect::<Vec<f32>>();
    let adapter = |name: &str, module: &str, out: usize, input: usize| {
        let path = dir.path().join(name);
        std::fs::create_dir(&path).unwrap();
        let mut archive = Archive::new();
        let a = Tensor::from_vec(factor(RANK * input, 1.0), &[RANK, input]).unwrap();
        let b = Tensor::from_vec(factor(out * RANK, 2.0), &[out, RANK]).unwrap();
        archive.insert(format!("base_model.model.{module}.lora_A.weight"), a);
        archive.insert(format!("base_model.model.{module}.lora_B.weight"), b);
        archive.save(path.join("adapter_model.safetensors")).unwrap();
        let leaf = module.rsplit('.').next().unwrap();
        let config = serde_json::json!({"peft_type": "LORA", "r": RANK, "lora_alpha": 8, "target_modules": [leaf]});
        std::fs::write(path.join("adapter_config.json"), config.to_string()).unwrap();
        path
    };
    let plain = folder("plain", &|_, values| values);
    let base = logits(&plain, None).unwrap();

    // Attention: applied beside the GGUF file's stacks, as merged into the folder.
    let attention = adapter("attention", "model.layers.0.self_attn.q_proj", 128, 64);
    let merged = logits(&plain, Some(&attention)).unwrap();
    let beside = logits(&models.join("model-f32.gguf"), Some(&attention)).unwrap();
    assert!(max_abs_diff(&merged, &base, "attention") > 1e-2, "the adapter changes the model");
    let diff = max_abs_diff(&beside, &merged, "attention");
    assert!(diff <= 1e-4, "attention LoRA beside the GGUF stacks differs from the merged folder by {diff}");

    // An expert: merged into the folder's weight of that expert, as merging it by hand does.
    let module = "model.layers.1.mlp.experts.3.gate_proj";
    let experts = adapter("experts", module, 48, 64);
    let (a, b) = (factor(RANK * 64, 1.0), factor(48 * RANK, 2.0));
    let by_hand = folder("by-hand", &|name, mut values| {
        if name == format!("{module}.weight") {
            for (at, value) in values.iter_mut().enumerate() {
                let (row, column) = (at / 64, at % 64);
                *value += 2.0 * (0..RANK).map(|k| b[row * RANK + k] * a[k * 64 + column]).sum::<f32>();
            }
        }
        values
    });
    let merged = logits(&plain, Some(&experts)).unwrap();
    assert!(max_abs_diff(&merged, &base, "experts") > 1e-3, "the routed expert's change reaches the logits");
    let diff = max_abs_diff(&merged, &logits(&by_hand, None).unwrap(), "experts");
    assert!(diff <= 1e-5, "the expert's merged adapter differs from merging it by hand by {diff}");

    // Beside a GGUF file's packed stacks: refused by module, pointing at the folder.
    let error = logits(&models.join("model-q8_0.gguf"), Some(&experts)).expect_err("refused").to_string();
    assert!(error.contains(module) && error.contains("experts") && error.contains("folder"), "{error}");
}
