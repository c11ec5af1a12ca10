//! Remote archive benchmark (`cargo bench --bench remote`): importing a sharded BF16 Llama
//! checkpoint of about 1 GiB from an S3-compatible server on loopback (`moto`, installed by
//! `scripts/setup.sh`), three ways, in the same run:
//!
//! - the whole model through range reads (`Archive::open_remote` + `import_into`);
//! - two tensor-parallel ranks, each importing its half of the attention and MLP weights;
//! - downloading the shards first (`nnx::remote::download`), then importing the local folder:
//!   what users do without range reads.
//!
//! Each row gives the time, the bytes the server sent (bodies) and the requests. The checkpoint
//! is written into `NNX_BENCH_DIR` (else the system temporary folder) and removed at the end;
//! moto keeps the uploaded copy in memory. Loopback has no latency: over a network the
//! difference in bytes is the difference in time.

#[allow(dead_code)]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nnx::models::TokenEmbedding;
use nnx::models::llama::{DecoderConfig, Llama, LlamaConfig};
use nnx::nn::{Init, Linear};
use nnx::remote::RemoteOptions;
use nnx::{Archive, DType, ImportOptions, SaveOptions, TensorParallel};

/// A Llama of about 520M parameters: 1.05 GiB in BF16.
const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 2048,
  "intermediate_size": 5632,
  "num_hidden_layers": 9,
  "num_attention_heads": 32,
  "num_key_value_heads": 4,
  "vocab_size": 32000,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false
}"#;

/// moto on a free loopback port, killed when dropped.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> Result<Server, String> {
    let python = common::python();
    let port =
        TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?.local_addr().map_err(|e| e.to_string())?.port();
    let child = Command::new(&python)
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("`{}` cannot be run ({error}): run scripts/setup.sh", python.display()))?;
    let mut server = Server(child, port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(format!("moto exited ({status}): run scripts/setup.sh, which installs moto[server]"));
        }
        if Instant::now() > deadline {
            return Err("moto did not start within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The bucket, with an unsigned PUT (moto accepts it).
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(stream, "PUT /bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    if !response.starts_with("HTTP/1.1 200") {
        return Err(format!("the bucket was not created: {}", response.lines().next().unwrap_or("")));
    }
    Ok(server)
}

/// A meta model for `rank` of `world` (the whole model for a world of 1).
fn meta(config: &LlamaConfig, world: usize) -> Llama {
    let mut local = config.clone();
    local.num_attention_heads /= world;
    local.num_key_value_heads = Some(config.kv_heads() / world);
    local.head_dim = Some(config.head_dim());
    local.intermediate_size /= world;
    let mut model = Llama::new(&local, DType::BF16, Init::Meta);
    if world > 1 {
        // Vocabulary-parallel embedding and head: each rank holds its share of the rows.
        model.embed = TokenEmbedding::new(config.vocab_size / world, config.hidden_size, DType::BF16, Init::Meta);
        model.lm_head = Some(
            Linear::builder(config.hidden_size, config.vocab_size / world)
                .bias(false)
                .dtype(DType::BF16)
                .init(Init::Meta)
                .build(),
        );
        for layer in &mut model.layers {
            let linear =
                |input, output| Linear::builder(input, output).bias(false).dtype(DType::BF16).init(Init::Meta).build();
            layer.attn.o = linear(local.num_attention_heads * config.head_dim(), config.hidden_size);
            layer.mlp.down = linear(local.intermediate_size, config.hidden_size);
        }
    }
    model
}

fn placement(rank: usize) -> TensorParallel {
    TensorParallel {
        world_size: 2,
        rank,
        column: ["attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"]
            .map(|p| format!("layers.*.{p}"))
            .into_iter()
            .chain(["embed".to_string(), "lm_head".to_string()])
            .collect(),
        row: vec!["layers.*.attn.o".into(), "layers.*.mlp.down".into()],
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() -> nnx::Result<()> {
    let root = std::env::var_os("NNX_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = root.join(format!("nnx-bench-remote-{}", std::process::id()));
    let folder = dir.join("model");
    std::fs::create_dir_all(&folder).map_err(|source| nnx::Error::Io {
        action: "create",
        path: folder.clone(),
        source,
    })?;
    let config: LlamaConfig = serde_json::from_str(CONFIG).expect("the benchmark configuration parses");
    eprintln!("writing the checkpoint into {}", folder.display());
    let model = Llama::new(&config, DType::BF16, Init::Zeros);
    let options = SaveOptions { max_shard_bytes: Some(256 << 20), ..SaveOptions::default() };
    Archive::export_from(&model, "")?.save_with(folder.join("model.safetensors"), &options)?;
    drop(model);
    let result = run(&config, &folder, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(config: &LlamaConfig, folder: &Path, dir: &Path) -> nnx::Result<()> {
    let server = match start_moto() {
        Ok(server) => server,
        Err(reason) => {
            println!("moto not run ({reason})");
            return Ok(());
        }
    };
    let endpoint = format!("http://127.0.0.1:{}", server.1);
    let remote = RemoteOptions::default()
        .with("aws_endpoint", &endpoint)
        .with("aws_allow_http", "true")
        .with("aws_access_key_id", "bench")
        .with("aws_secret_access_key", "bench")
        .with("aws_region", "us-east-1");
    let mut files: Vec<String> = Vec::new();
    let mut total = 0u64;
    let started = Instant::now();
    for item in
        std::fs::read_dir(folder).map_err(|source| nnx::Error::Io { action: "list", path: folder.into(), source })?
    {
        let path = item.map_err(|source| nnx::Error::Io { action: "list", path: folder.into(), source })?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_string();
        total += std::fs::metadata(&path).map(|meta| meta.len()).unwrap_or(0);
        nnx::remote::upload(&path, &format!("s3://bench/model/{name}"), &remote)?;
        files.push(name);
    }
    eprintln!("uploaded {} in {} files in {:.1} s", mib(total), files.len(), started.elapsed().as_secs_f64());

    // What one request costs on this server: opening a shard is two small range requests.
    let shard = files.iter().find(|name| name.ends_with(".safetensors")).cloned().unwrap_or_default();
    let started = Instant::now();
    Archive::open_remote(&format!("s3://bench/model/{shard}"), &remote)?;
    let per_request = started.elapsed() / 2;
    let mut rows = Vec::new();
    // The whole model through range reads.
    let started = Instant::now();
    let archive = Archive::open_remote("s3://bench/model/", &remote)?;
    archive.import_into(&mut meta(config, 1), "")?;
    let (time, stats) = (started.elapsed(), archive.transfer_stats().unwrap_or_default());
    rows.push(("whole model, range reads".to_string(), time, stats.bytes, stats.requests));
    // Two ranks, one after the other (on separate machines they run at once).
    for rank in 0..2 {
        let started = Instant::now();
        let archive = Archive::open_remote("s3://bench/model/", &remote)?;
        archive.import_into_with(
            &mut meta(config, 2),
            "",
            &ImportOptions::default().with_placement(placement(rank)),
        )?;
        let (time, stats) = (started.elapsed(), archive.transfer_stats().unwrap_or_default());
        rows.push((format!("rank {rank} of 2, its slices only"), time, stats.bytes, stats.requests));
    }
    // Downloading the shards first, then importing the local copy.
    let local = dir.join("downloaded");
    std::fs::create_dir_all(&local).map_err(|source| nnx::Error::Io {
        action: "create",
        path: local.clone(),
        source,
    })?;
    let started = Instant::now();
    let mut downloaded = 0u64;
    for name in files.iter().filter(|name| name.ends_with(".safetensors") || name.ends_with(".json")) {
        downloaded += nnx::remote::download(&format!("s3://bench/model/{name}"), &local.join(name), &remote)?;
    }
    Archive::open(&local)?.import_into(&mut meta(config, 1), "")?;
    rows.push(("download the shards, then import".to_string(), started.elapsed(), downloaded, files.len() as u64));

    println!("Importing a {} sharded BF16 Llama ({} files) from S3 (moto) on loopback\n", mib(total), files.len());
    println!("| how | time | bytes sent | requests | vs downloading first |");
    println!("|---|---:|---:|---:|---:|");
    let baseline = rows.last().map_or(Duration::ZERO, |row| row.1);
    for (how, time, bytes, requests) in rows {
        println!(
            "| {how} | {:.2} s | {} | {requests} | {:.2}x |",
            time.as_secs_f64(),
            mib(bytes),
            baseline.as_secs_f64() / time.as_secs_f64().max(1e-9)
        );
    }
    println!(
        "\nOne range request costs {:.0} ms on this server whatever its size (moto reads the whole object for each).",
        per_request.as_secs_f64() * 1e3
    );
    println!(
        "Range reads use the defaults: ranges within 1 MiB coalesced, 8 requests in flight, 16 MiB at most each. \
         A rank's column-parallel weights (q, k, v, gate, up, the embedding and the head) are one range each; its \
         row-parallel ones (o, down) are one range per row, which the 1 MiB gap merges into whole reads \
         (`coalesce_gap: 0` fetches exactly the share, one request per row)."
    );
    Ok(())
}
