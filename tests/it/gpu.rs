//! Devices in the type: models placed on the GPU leaf by leaf, with shared storages kept
//! shared and configuration cloned. Runs on whatever adapter is found (Mesa's lavapipe in CI,
//! where a missing adapter fails the test instead of skipping it).

use nnx::nn::{Init, Linear};
use nnx::{DType, Device, Gpu, Host, Module, Tensor};

/// The adapter the tests use: `NNX_GPU` (default 0); none skips with a message, except under CI.
pub fn gpu() -> Option<Gpu> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    match Gpu::open(index) {
        Ok(gpu) => Some(gpu),
        Err(error) if std::env::var_os("CI").is_some() => panic!("CI runs the GPU tests on an adapter: {error}"),
        Err(error) => {
            eprintln!("skipping: {error}");
            None
        }
    }
}

#[derive(Module, Clone, Debug)]
struct Mlp<D: Device = Host> {
    fc1: Linear<D>,
    fc2: Linear<D>,
    #[nnx(tie = "fc1")]
    tied: Linear<D>,
    #[nnx(skip)]
    hidden: usize,
}

fn mlp(init: Init) -> Mlp {
    let fc1 = Linear::builder(4, 8).init(init.at("fc1")).build();
    let tied = Linear { weight: fc1.weight.clone(), bias: None };
    Mlp { fc1, fc2: Linear::builder(8, 3).dtype(DType::BF16).init(init.at("fc2")).build(), tied, hidden: 8 }
}

#[test]
fn placing_moves_every_leaf_and_keeps_ties_and_configuration() {
    let Some(gpu) = gpu() else { return };
    let host = mlp(Init::Seeded(7));
    // The host model is still a plain module: its names are unchanged.
    let keys: Vec<String> = host.flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(keys, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "tied.weight"]);

    let placed: Mlp<Gpu> = host.place(&gpu).unwrap();
    assert_eq!(placed.hidden, 8);
    for (on_host, on_gpu) in [
        (&host.fc1.weight, &placed.fc1.weight),
        (host.fc1.bias.as_ref().unwrap(), placed.fc1.bias.as_ref().unwrap()),
        (&host.fc2.weight, &placed.fc2.weight),
        (&host.tied.weight, &placed.tied.weight),
    ] {
        assert_eq!(on_gpu.device(), &gpu);
        let back = on_gpu.to_host().unwrap();
        assert_eq!((back.dtype(), back.shape()), (on_host.dtype(), on_host.shape()));
        assert_eq!(back.to_bytes().unwrap(), on_host.to_bytes().unwrap());
    }
    assert!(placed.tied.weight.shares_storage(&placed.fc1.weight), "a tie is one buffer on the device");
    assert!(!placed.fc2.weight.shares_storage(&placed.fc1.weight));
}

#[test]
fn a_meta_model_places_as_a_meta_model() {
    let Some(gpu) = gpu() else { return };
    let placed = mlp(Init::Meta).place(&gpu).unwrap();
    assert!(placed.fc1.weight.is_meta() && placed.fc2.weight.is_meta());
    assert_eq!(placed.fc2.weight.dtype(), DType::BF16);
    assert_eq!(placed.fc1.weight.shape(), [8, 4]);
}

#[test]
fn placing_on_the_host_shares_the_tensors() {
    let host = mlp(Init::Seeded(1));
    let again: Mlp = host.place(&Host).unwrap();
    assert!(again.fc1.weight.shares_storage(&host.fc1.weight));
    let _: Tensor = again.tied.weight;
}

/// The largest `|a - b|` over two logit tensors, and the largest `|a|`.
fn widest(ours: &Tensor, theirs: &Tensor) -> (f32, f32) {
    let (a, b) = (ours.to_vec::<f32>().unwrap(), theirs.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    (diff, b.iter().map(|x| x.abs()).fold(0.0f32, f32::max))
}

#[test]
fn gpt2_and_llama_logits_on_the_gpu_match_the_host() {
    use nnx::Pretrained;
    use nnx::models::{gpt2::Gpt2, llama::Llama};
    let Some(gpu) = gpu() else { return };
    let ids = [1u32, 7, 42, 3, 99, 5, 12];
    let gpt2 = Gpt2::from_pretrained(crate::util::fixtures().join("gpt2-tiny")).unwrap();
    let on_gpu = gpt2.place(&gpu).unwrap();
    let (diff, scale) = widest(&on_gpu.forward(&ids).unwrap().to_host().unwrap(), &gpt2.forward(&ids).unwrap());
    println!("gpt2-tiny: max |gpu - cpu| {diff:e} (logits up to {scale})");
    assert!(diff <= 1e-4, "gpt2 logits differ by {diff}");

    // Llama's fixture is BF16: the GPU reads the weights as stored and computes in f32.
    let llama = Llama::from_pretrained(crate::util::fixtures().join("llama-tiny")).unwrap();
    let on_gpu = llama.place(&gpu).unwrap();
    let (diff, scale) = widest(&on_gpu.forward(&ids).unwrap().to_host().unwrap(), &llama.forward(&ids).unwrap());
    println!("llama-tiny: max |gpu - cpu| {diff:e} (logits up to {scale})");
    assert!(diff <= 1e-4, "llama logits differ by {diff}");
    use nnx::models::CausalLm;
    assert_eq!(on_gpu.generate(&ids[..3], 4).unwrap(), llama.generate(&ids[..3], 4).unwrap());
}

#[test]
fn minilm_on_the_gpu_matches_sentence_transformers() {
    use nnx::models::sentence::SentenceEncoder;
    let Some(gpu) = gpu() else { return };
    let encoder = SentenceEncoder::from_folder(crate::minilm::model_folder()).unwrap().on_gpu(&gpu).unwrap();
    let reference = crate::minilm::reference();
    let sentences: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let embeddings = encoder.encode(&sentences, 4).unwrap();
    let worst = embeddings
        .iter()
        .zip(&reference.embeddings)
        .map(|(ours, theirs)| crate::minilm::cosine(ours, theirs))
        .fold(1.0, f64::min);
    println!("all-MiniLM-L6-v2 on {}: lowest cosine {worst:.8}", gpu.name());
    assert!(worst >= 0.99999, "lowest cosine {worst}");
}

#[test]
fn importing_straight_onto_the_gpu_equals_importing_on_the_host() {
    use nnx::Archive;
    use nnx::models::gpt2::{Gpt2, Gpt2Config};
    use nnx::models::llama::{Llama, LlamaConfig};
    let Some(gpu) = gpu() else { return };
    let ids = [4u32, 8, 15, 16, 23, 42];

    let folder = crate::util::fixtures().join("gpt2-tiny");
    let config = Gpt2Config::from_file(folder.join("config.json")).unwrap();
    let mut on_host = Gpt2::new(&config, DType::F32, Init::Meta);
    Archive::open(&folder).unwrap().import_into(&mut on_host, "").unwrap();
    let mut on_gpu = Gpt2::new(&config, DType::F32, Init::Meta).place(&gpu).unwrap();
    assert!(on_gpu.wte.weight.is_meta());
    let report = Archive::open(&folder).unwrap().import_into(&mut on_gpu, "").unwrap();
    assert!(report.tied.contains(&"lm_head.weight".to_string()), "{report:?}");
    assert!(!on_gpu.wte.weight.is_meta() && on_gpu.wte.weight.device() == &gpu);
    assert!(on_gpu.lm_head.weight.shares_storage(&on_gpu.wte.weight), "the tie is one buffer");
    let (diff, _) = widest(&on_gpu.forward(&ids).unwrap().to_host().unwrap(), &on_host.forward(&ids).unwrap());
    assert!(diff <= 1e-4, "gpt2 imported onto the gpu differs by {diff}");
    // The transposed and split weights arrive as the host builds them.
    assert_eq!(
        on_gpu.h[0].attn.k.weight.to_host().unwrap().to_bytes().unwrap(),
        on_host.h[0].attn.k.weight.contiguous().to_bytes().unwrap()
    );

    // BF16 weights cast to F32 on the way.
    let folder = crate::util::fixtures().join("llama-tiny");
    let config = LlamaConfig::from_file(folder.join("config.json")).unwrap();
    let mut on_host = Llama::new(&config, DType::F32, Init::Meta);
    Archive::open(&folder).unwrap().import_into(&mut on_host, "").unwrap();
    let mut on_gpu = Llama::new(&config, DType::F32, Init::Meta).place(&gpu).unwrap();
    let report = Archive::open(&folder).unwrap().import_into(&mut on_gpu, "").unwrap();
    assert!(!report.cast.is_empty());
    assert_eq!(on_gpu.embed.weight.dtype(), DType::F32);
    let (diff, _) = widest(&on_gpu.forward(&ids).unwrap().to_host().unwrap(), &on_host.forward(&ids).unwrap());
    assert!(diff <= 1e-4, "llama imported onto the gpu differs by {diff}");
}
