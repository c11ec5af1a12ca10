//! `nnx embed`: the sentence embeddings of a sentence-transformers folder on the command line,
//! pooled and normalised as its `modules.json` declares, against sentence-transformers' own and
//! against the encoder's hidden states; and `nnx run` naming `nnx embed` for an encoder.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nnx::Pretrained;
use nnx::models::bert::{Batch, Bert};
use nnx::models::sentence::SentenceEncoder;

use crate::minilm::{cosine, model_folder, reference};
use crate::util::{floats, max_abs_diff, nnx_binary, nnx_ok, run_nnx, scratch, text};

/// What `nnx embed --json` prints.
#[derive(serde::Deserialize)]
struct Embedded {
    model: String,
    dimension: usize,
    pooling: String,
    normalized: bool,
    embeddings: Vec<Vec<f32>>,
}

/// `nnx embed --json FOLDER TEXTS...`, which must succeed.
fn embed_json(folder: &Path, texts: &[&str]) -> Embedded {
    let mut args = vec!["embed", "--json", text(folder)];
    args.extend_from_slice(texts);
    serde_json::from_str(&nnx_ok(&args)).expect("`nnx embed --json` prints one JSON object")
}

/// A copy of the MiniLM folder in `dir` whose files link to the originals, except
/// `modules.json` and `1_Pooling`, which the caller writes.
fn linked_copy(dir: &Path) -> PathBuf {
    let source = model_folder();
    let copy = dir.join("minilm");
    std::fs::create_dir_all(copy.join("1_Pooling")).unwrap();
    for item in std::fs::read_dir(&source).unwrap() {
        let item = item.unwrap();
        let name = item.file_name();
        if item.file_type().unwrap().is_file() && name != "modules.json" {
            std::os::unix::fs::symlink(item.path(), copy.join(name)).unwrap();
        }
    }
    copy
}

/// A `modules.json`: the encoder, its pooling in `1_Pooling`, and `Normalize` when `normalize`.
fn modules(normalize: bool) -> String {
    let mut modules = vec![
        serde_json::json!({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}),
        serde_json::json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
    ];
    if normalize {
        modules.push(
            serde_json::json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}),
        );
    }
    serde_json::Value::Array(modules).to_string()
}

/// A pooling `config.json` as sentence-transformers saves it, with `mode` the one key set.
fn pooling_config(mode: &str) -> String {
    let mut config = serde_json::json!({"word_embedding_dimension": 384, "include_prompt": true});
    for key in [
        "pooling_mode_cls_token",
        "pooling_mode_mean_tokens",
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
        "pooling_mode_lasttoken",
    ] {
        config[key] = serde_json::Value::Bool(key == mode);
    }
    config.to_string()
}

#[test]
fn embed_json_matches_the_sentence_transformers_reference() {
    let folder = model_folder();
    let reference = reference();
    let sentences: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let embedded = embed_json(&folder, &sentences);
    assert_eq!(embedded.model, text(&folder));
    assert_eq!((embedded.dimension, embedded.pooling.as_str(), embedded.normalized), (384, "mean", true));
    assert_eq!(embedded.embeddings.len(), reference.embeddings.len());
    for (at, (ours, theirs)) in embedded.embeddings.iter().zip(&reference.embeddings).enumerate() {
        let similarity = cosine(ours, theirs);
        let max_diff = max_abs_diff(ours, theirs, &format!("embedding of sentence {at}"));
        assert!(similarity >= 0.99999, "sentence {at} {:?}: cosine {similarity}", sentences[at]);
        assert!(max_diff <= 1e-4, "sentence {at} {:?}: max abs difference {max_diff}", sentences[at]);
    }
    // The command prints the library's floats as they are.
    let library = SentenceEncoder::from_folder(&folder).unwrap().encode(&sentences, 32).unwrap();
    assert_eq!(embedded.embeddings, library);
    let value: serde_json::Value =
        serde_json::from_str(&nnx_ok(&["embed", "--json", text(&folder), "a", "b"])).unwrap();
    assert_eq!(floats(&value["embeddings"]).len(), 2 * 384);
}

#[test]
fn embed_reads_one_text_per_line_of_standard_input() {
    let folder = model_folder();
    let sentences = ["A man is eating food.", "", "That is a happy dog"];
    let mut child = Command::new(nnx_binary())
        .args(["embed", "--json", "--batch-size", "2", text(&folder)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(sentences.join("\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let embedded: Embedded = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(embedded.embeddings, embed_json(&folder, &sentences).embeddings);

    let (code, _, stderr) = run_nnx(&["embed", text(&folder), "x", "--batch-size", "0"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`--batch-size`"), "{stderr}");
}

#[test]
fn embed_summarises_each_text_and_their_cosine_similarities() {
    let folder = model_folder();
    let out = nnx_ok(&["embed", text(&folder), "A man is eating food.", "A man is riding a horse."]);
    assert!(out.contains("384 dimensions, mean pooling, normalized"), "{out}");
    assert!(out.contains("\"A man is eating food.\"") && out.contains("norm 1.0000"), "{out}");
    let reference = reference();
    let similarity = cosine(&reference.embeddings[7], &reference.embeddings[8]);
    let rows: Vec<&str> = out.lines().skip_while(|line| *line != "cosine similarity").collect();
    assert_eq!(rows.len(), 4, "a title, a header and two rows: {out}");
    assert!(rows[2].contains(&format!("{similarity:.3}")), "{out}");
}

#[test]
fn embed_is_what_nnx_run_names_for_an_encoder() {
    let folder = model_folder();
    let (code, stdout, stderr) = run_nnx(&["run", text(&folder), "--prompt", "hi"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stderr.contains("encoder") && stderr.contains("`nnx embed MODEL TEXT...`"), "{stderr}");
    assert!(!stderr.contains("own `config.json`"), "{stderr}");

    // A GGUF encoder, and a folder of another encoder, which `nnx embed` refuses in turn.
    let dir = scratch();
    let gguf = dir.path().join("bert.gguf");
    let mut writer = nnx::gguf::GgufWriter::new();
    writer.metadata_mut().set("general.architecture", nnx::gguf::Value::String("bert".into()));
    writer.write(&gguf).unwrap();
    let (code, _, stderr) = run_nnx(&["run", text(&gguf), "--prompt", "hi"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`general.architecture` `bert`") && stderr.contains("nnx embed"), "{stderr}");

    let roberta = linked_copy(dir.path());
    std::fs::remove_file(roberta.join("config.json")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "roberta".into();
    std::fs::write(roberta.join("config.json"), config.to_string()).unwrap();
    let (code, _, stderr) = run_nnx(&["run", text(&roberta), "--prompt", "hi"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`model_type` `roberta`") && stderr.contains("nnx embed"), "{stderr}");
    let (code, _, stderr) = run_nnx(&["embed", text(&roberta), "hi"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`model_type` is the string `roberta`, but nnx needs `bert`"), "{stderr}");
}

#[test]
fn embed_with_cls_pooling_gives_the_first_token_state_of_the_encoder() {
    let reference = reference();
    let sentences: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    // The hidden states of sentence-transformers' token ids, through the padded forward pass.
    let model = Bert::from_pretrained(model_folder()).unwrap();
    let batch = Batch::pad(&reference.ids, 0);
    let states = model.forward(&batch).unwrap().to_vec::<f32>().unwrap();
    let first_tokens: Vec<&[f32]> = states.chunks(batch.seq * 384).map(|sequence| &sequence[..384]).collect();

    let dir = scratch();
    let folder = linked_copy(dir.path());
    std::fs::write(folder.join("1_Pooling/config.json"), pooling_config("pooling_mode_cls_token")).unwrap();
    for normalize in [false, true] {
        std::fs::write(folder.join("modules.json"), modules(normalize)).unwrap();
        let embedded = embed_json(&folder, &sentences);
        assert_eq!((embedded.pooling.as_str(), embedded.normalized), ("cls", normalize));
        for (at, (ours, first)) in embedded.embeddings.iter().zip(&first_tokens).enumerate() {
            let length = first.iter().map(|x| x * x).sum::<f32>().sqrt();
            let expected: Vec<f32> = first.iter().map(|x| if normalize { x / length } else { *x }).collect();
            let max_diff = max_abs_diff(ours, &expected, &format!("first token of sentence {at}"));
            assert!(max_diff <= 1e-4, "sentence {at}, normalize {normalize}: max abs difference {max_diff}");
            // Not the mean pooling of the reference, and of unit length only when normalised.
            let difference = max_abs_diff(ours, &reference.embeddings[at], "against mean pooling");
            assert!(difference > 0.05, "sentence {at}: {difference} from mean pooling");
            let ours_length = ours.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert_eq!((ours_length - 1.0).abs() < 1e-4, normalize, "sentence {at}: length {ours_length}");
        }
    }
}

#[test]
fn embed_refuses_damaged_sentence_transformers_files_by_name() {
    let dir = scratch();
    let folder = linked_copy(dir.path());
    let pooling = folder.join("1_Pooling/config.json");
    let modules_path = folder.join("modules.json");
    let dense = r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#;
    let outside = r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "../../etc", "type": "sentence_transformers.models.Pooling"}]"#;
    let two_modes = pooling_config("pooling_mode_cls_token")
        .replace(r#""pooling_mode_max_tokens":false"#, r#""pooling_mode_max_tokens":true"#);
    let cases: [(&str, String, String, &Path, &str); 6] = [
        (
            "a mode that is not a boolean",
            modules(true),
            pooling_config("pooling_mode_cls_token").replace("true", "\"yes\""),
            pooling.as_path(),
            "`pooling_mode_cls_token` is the string `yes`",
        ),
        (
            "text that is not JSON",
            modules(true),
            r#"{"pooling_mode_cls_token": tru"#.into(),
            pooling.as_path(),
            "not valid JSON",
        ),
        (
            "two modes",
            modules(true),
            two_modes,
            pooling.as_path(),
            "`pooling_mode_max_tokens` is `true`, as is `pooling_mode_cls_token`",
        ),
        ("a file far too large", modules(true), format!("{}{{}}", " ".repeat(1 << 20)), pooling.as_path(), "64 KiB"),
        (
            "a module nnx does not compute",
            dense.into(),
            pooling_config("pooling_mode_mean_tokens"),
            modules_path.as_path(),
            "`[2].type`",
        ),
        (
            "a folder outside the model",
            outside.into(),
            pooling_config("pooling_mode_mean_tokens"),
            modules_path.as_path(),
            "`[1].path`",
        ),
    ];
    for (case, modules_text, pooling_text, named, expected) in cases {
        std::fs::write(modules_path.as_path(), modules_text).unwrap();
        std::fs::write(&pooling, pooling_text).unwrap();
        let (code, stdout, stderr) = run_nnx(&["embed", text(&folder), "hi"]);
        assert_eq!(code, 1, "{case}: {stdout}");
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|line| line.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{case}: one `error:` line: {stderr}");
        assert!(errors[0].contains(text(named)) && errors[0].contains(expected), "{case}: {stderr}");
    }
    // A missing pooling file is named too.
    std::fs::write(modules_path.as_path(), modules(true)).unwrap();
    std::fs::remove_file(&pooling).unwrap();
    let (code, _, stderr) = run_nnx(&["embed", text(&folder), "hi"]);
    assert_eq!(code, 1);
    assert!(stderr.contains(text(&pooling)), "{stderr}");
}
