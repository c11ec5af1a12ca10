//! Archives: mapped loading, strict prefix-scoped loads, sections, atomic and deterministic
//! saves, page alignment, shards, unions.

use std::collections::BTreeMap;

use half::bf16;
use nnx::nn::{Init, LayerNorm, Linear};
use nnx::{Archive, DType, Error, Module, SaveOptions, Tensor};

use crate::util::scratch;

#[derive(Module, Clone)]
struct Block {
    norm: LayerNorm,
    proj: Linear,
}

#[derive(Module, Clone)]
struct Net {
    embed: Tensor,
    blocks: Vec<Block>,
    head: Option<Linear>,
    #[nnx(skip)]
    width: usize,
}

impl Net {
    fn new(width: usize, layers: usize, init: Init) -> Net {
        Net {
            embed: match init {
                Init::Meta => Tensor::meta(DType::F32, &[10, width]),
                _ => Tensor::from_vec((0..10 * width).map(|v| v as f32).collect(), &[10, width]).unwrap(),
            },
            blocks: (0..layers)
                .map(|layer| Block {
                    norm: LayerNorm::builder(width).init(init).build(),
                    proj: Linear::builder(width, width).init(init.at(&format!("blocks.{layer}.proj"))).build(),
                })
                .collect(),
            head: Some(Linear::builder(width, 3).bias(false).init(init.at("head")).build()),
            width,
        }
    }
}

#[derive(Module)]
struct AdamState<M: Module> {
    mu: M,
    nu: M,
    step: Tensor,
}

fn values(module: &impl Module) -> Vec<(String, Vec<f32>)> {
    module.flat_state_dict().iter().map(|(name, t)| (name.to_string(), t.to_vec::<f32>().unwrap())).collect()
}

#[test]
fn saved_models_load_back_as_views_of_the_file() {
    let dir = scratch();
    let path = dir.path().join("net.safetensors");
    let net = Net::new(4, 2, Init::Seeded(3));
    Archive::from_module(&net, "").save(&path).unwrap();

    let archive = Archive::open(&path).unwrap();
    let names: Vec<&str> = archive.names().collect();
    assert_eq!(names, net.flat_state_dict().keys().collect::<Vec<_>>(), "listing keeps walk order");
    let mut loaded = Net::new(4, 2, Init::Meta);
    archive.load_into(&mut loaded, "").unwrap();
    assert_eq!(values(&loaded), values(&net));
    assert!(loaded.flat_state_dict().iter().all(|(_, t)| t.is_mapped()), "no tensor byte copied");
    assert_eq!(loaded.width, 4);
}

#[test]
fn strict_loads_name_every_problem_and_change_nothing() {
    let dir = scratch();
    let path = dir.path().join("net.safetensors");
    let mut archive = Archive::from_module(&Net::new(4, 2, Init::Seeded(1)), "");
    archive.insert("blocks.1.proj.weights", Tensor::zeros(DType::F32, &[4, 4]));
    archive.insert("blocks.0.norm.bias", Tensor::zeros(DType::F16, &[4]));
    archive.save(&path).unwrap();

    let mut target = Net::new(4, 3, Init::Zeros);
    target.head = Some(Linear::builder(4, 5).bias(false).init(Init::Zeros).build());
    let before = values(&target);
    let error = Archive::open(&path).unwrap().load_into(&mut target, "").unwrap_err();
    let Error::Load(report) = &error else { panic!("expected a load error, got {error}") };
    let message = error.to_string();
    assert!(message.starts_with(&format!("cannot load `{}` into `Net`:", path.display())), "{message}");
    let lines: Vec<&str> = message.lines().skip(1).map(str::trim).collect();
    assert_eq!(
        lines,
        [
            "`blocks.0.norm.bias`: expected dtype F32, found F16",
            "missing `blocks.2.norm.weight`",
            "missing `blocks.2.norm.bias`",
            "missing `blocks.2.proj.weight`",
            "missing `blocks.2.proj.bias`",
            "`head.weight`: expected shape [5, 4], found [3, 4]",
            "unexpected `blocks.1.proj.weights` (did you mean `blocks.1.proj.weight`?)",
        ]
    );
    assert_eq!(report.problems.len(), 7);
    assert_eq!(values(&target), before, "a failed load leaves the model unchanged");
}

#[test]
fn sections_share_one_file_and_resume_an_optimizer() {
    let dir = scratch();
    let path = dir.path().join("checkpoint.safetensors");
    let model = Net::new(3, 1, Init::Seeded(5));
    let optim = AdamState {
        mu: Net::new(3, 1, Init::Seeded(6)),
        nu: Net::new(3, 1, Init::Seeded(7)),
        step: Tensor::from_vec(vec![42i64], &[]).unwrap(),
    };
    let file = Archive::union([Archive::from_module(&model, "model"), Archive::from_module(&optim, "optim")]).unwrap();
    file.save(&path).unwrap();

    let archive = Archive::open(&path).unwrap();
    assert!(archive.names().any(|name| name == "optim.mu.blocks.0.proj.weight"));
    let mut resumed_model = Net::new(3, 1, Init::Meta);
    let mut resumed_optim = AdamState {
        mu: Net::new(3, 1, Init::Meta),
        nu: Net::new(3, 1, Init::Meta),
        step: Tensor::meta(DType::I64, &[]),
    };
    archive.load_into(&mut resumed_model, "model").unwrap();
    archive.load_into(&mut resumed_optim, "optim").unwrap();
    assert_eq!(values(&resumed_model), values(&model));
    assert_eq!(values(&resumed_optim.nu), values(&optim.nu));
    assert_eq!(resumed_optim.step.to_vec::<i64>().unwrap(), [42]);

    // A section loads into a submodule; entries outside its prefix are ignored.
    let mut block = Block {
        norm: LayerNorm::builder(3).init(Init::Meta).build(),
        proj: Linear::builder(3, 3).init(Init::Meta).build(),
    };
    archive.load_into(&mut block, "optim.mu.blocks.0").unwrap();
    assert_eq!(values(&block), values(&optim.mu.blocks[0]));

    // A wrong prefix says what is missing instead of loading nothing.
    let error = archive.load_into(&mut block, "optim.blocks.0").unwrap_err().to_string();
    assert!(error.contains("missing `optim.blocks.0.norm.weight`"), "{error}");
}

#[test]
fn saving_over_a_mapped_file_keeps_live_tensors_valid() {
    let dir = scratch();
    let path = dir.path().join("weights.safetensors");
    let first = Net::new(4, 1, Init::Seeded(1));
    Archive::from_module(&first, "").save(&path).unwrap();
    let mut live = Net::new(4, 1, Init::Meta);
    Archive::open(&path).unwrap().load_into(&mut live, "").unwrap();

    let second = Net::new(4, 1, Init::Seeded(2));
    Archive::from_module(&second, "").save(&path).unwrap();
    // Saving the archive that is itself mapped from the target works as well.
    Archive::open(&path).unwrap().save(&path).unwrap();

    assert_eq!(values(&live), values(&first), "old tensors keep the old pages");
    let mut fresh = Net::new(4, 1, Init::Meta);
    Archive::open(&path).unwrap().load_into(&mut fresh, "").unwrap();
    assert_eq!(values(&fresh), values(&second));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("weights.safetensors")], "no temporary file left behind");
}

#[test]
fn saves_are_deterministic_and_keep_metadata() {
    let dir = scratch();
    let net = Net::new(4, 2, Init::Seeded(9));
    let mut options = SaveOptions::default();
    options.metadata.insert("config".into(), r#"{"width":4,"layers":2}"#.into());
    options.metadata.insert("format".into(), "pt".into());
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    Archive::from_module(&net, "").save_with(&a, &options).unwrap();
    Archive::from_module(&net.clone(), "").save_with(&b, &options).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let archive = Archive::open(&a).unwrap();
    let expected: BTreeMap<String, String> = options.metadata.clone();
    assert_eq!(archive.metadata(), &expected);
    // Re-saving an opened archive keeps its metadata and bytes.
    let c = dir.path().join("c.safetensors");
    archive.save(&c).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn views_and_mixed_dtypes_are_written_packed_and_aligned() {
    let dir = scratch();
    let path = dir.path().join("mixed.safetensors");
    let matrix = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3]).unwrap();
    let mut archive = Archive::new();
    archive.insert("flag", Tensor::from_vec(vec![true, false, true], &[3]).unwrap());
    archive.insert("transposed", matrix.transpose(0, 1).unwrap());
    archive.insert("half", Tensor::from_vec(vec![bf16::from_f32(1.5); 3], &[3]).unwrap());
    archive.insert("wide", Tensor::from_vec(vec![7i64, -7], &[2]).unwrap());
    archive.insert("empty", Tensor::zeros(DType::F32, &[0, 4]));
    archive.save(&path).unwrap();

    let loaded = Archive::open(&path).unwrap();
    assert_eq!(loaded.names().collect::<Vec<_>>(), ["flag", "transposed", "half", "wide", "empty"]);
    assert_eq!(
        loaded.tensor("transposed", DType::F32, &[3, 2]).unwrap().to_vec::<f32>().unwrap(),
        [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(loaded.get("flag").unwrap().to_vec::<bool>().unwrap(), [true, false, true]);
    for name in ["transposed", "half", "wide"] {
        assert!(loaded.get(name).unwrap().is_mapped(), "`{name}` is aligned for its dtype");
    }
    let wide = loaded.info("wide").unwrap().location.unwrap();
    assert_eq!(wide.file_offset % 8, 0);
}

#[test]
fn typed_reads_check_and_cast_only_floats() {
    let mut archive = Archive::new();
    archive.insert("w", Tensor::from_vec(vec![bf16::from_f32(0.5), bf16::from_f32(-2.0)], &[2]).unwrap());
    archive.insert("ids", Tensor::from_vec(vec![1i32, 2], &[2]).unwrap());
    assert_eq!(archive.float("w", DType::F32, &[2]).unwrap().to_vec::<f32>().unwrap(), [0.5, -2.0]);
    let same = archive.float("w", DType::BF16, &[2]).unwrap();
    assert!(same.shares_storage(&archive.get("w").unwrap()), "no cast when the dtype matches");
    let message = archive.float("ids", DType::F32, &[2]).unwrap_err().to_string();
    assert!(message.contains("`ids` in the archive is I32, not a float"), "{message}");
    let message = archive.tensor("w", DType::F32, &[2]).unwrap_err().to_string();
    assert_eq!(message, "`w` in the archive: expected F32 [2], found BF16 [2]");
    let message = archive.try_get("ws").unwrap_err().to_string();
    assert_eq!(message, "the archive has no entry `ws` (did you mean `w`?)");
    let message = Archive::from_module(&Linear::builder(2, 2).bias(false).init(Init::Meta).build(), "")
        .save("unused.safetensors")
        .unwrap_err()
        .to_string();
    assert!(message.contains("cannot save `weight`: it is a meta tensor"), "{message}");
}

#[test]
fn page_aligned_files_start_page_sized_entries_on_pages() {
    let dir = scratch();
    let path = dir.path().join("paged.safetensors");
    let mut archive = Archive::new();
    archive.insert("small", Tensor::from_vec(vec![1.0f32; 5], &[5]).unwrap());
    archive.insert("page", Tensor::from_vec(vec![2u16; 8192], &[8192]).unwrap());
    archive.insert("odd", Tensor::from_vec(vec![3u8; 7], &[7]).unwrap());
    archive.insert("pages", Tensor::from_vec(vec![4.0f32; 8192], &[2, 4096]).unwrap());
    archive.save_with(&path, &SaveOptions { page_align: true, ..SaveOptions::default() }).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + header_len) % nnx::PAGE_BYTES, 0);
    let loaded = Archive::open(&path).unwrap();
    for name in ["page", "pages"] {
        assert_eq!(loaded.info(name).unwrap().location.unwrap().file_offset % nnx::PAGE_BYTES, 0, "{name}");
    }
    assert_eq!(loaded.get("pages").unwrap().to_vec::<f32>().unwrap(), vec![4.0; 8192]);
    assert_eq!(loaded.get("odd").unwrap().to_vec::<u8>().unwrap(), vec![3; 7]);
}

#[test]
fn shards_are_greedy_and_opened_only_when_needed() {
    let dir = scratch();
    let path = dir.path().join("model.safetensors");
    let mut archive = Archive::new();
    archive.insert("a.weight", Tensor::from_vec(vec![1.0f32; 100], &[100]).unwrap()); // 400 bytes
    archive.insert("a.bias", Tensor::from_vec(vec![2.0f32; 100], &[100]).unwrap()); // 400
    archive.insert("big.weight", Tensor::from_vec(vec![3.0f32; 400], &[400]).unwrap()); // 1600, over the limit
    archive.insert("c.weight", Tensor::from_vec(vec![4.0f32; 50], &[50]).unwrap()); // 200
    let mut options = SaveOptions { max_shard_bytes: Some(1000), ..SaveOptions::default() };
    options.metadata.insert("format".into(), "pt".into());
    archive.save_with(&path, &options).unwrap();

    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("model.safetensors.index.json")).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], 2600);
    let map = &index["weight_map"];
    assert_eq!(map["a.weight"], "model-00001-of-00003.safetensors");
    assert_eq!(map["a.bias"], "model-00001-of-00003.safetensors");
    assert_eq!(map["big.weight"], "model-00002-of-00003.safetensors");
    assert_eq!(map["c.weight"], "model-00003-of-00003.safetensors");

    let sharded = Archive::open(dir.path()).unwrap();
    assert_eq!(sharded.names().collect::<Vec<_>>(), ["a.weight", "a.bias", "big.weight", "c.weight"]);
    assert_eq!(sharded.metadata()["format"], "pt");
    assert!(!sharded.metadata().contains_key("total_size"), "the shards' size belongs to the index alone");
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    assert_eq!(sharded.get("c.weight").unwrap().to_vec::<f32>().unwrap(), vec![4.0; 50]);
    let mut layer = Linear::builder(100, 1).init(Init::Meta).build();
    layer.weight = Tensor::meta(DType::F32, &[100]);
    layer.bias = Some(Tensor::meta(DType::F32, &[100]));
    sharded.load_into(&mut layer, "a").unwrap();
    assert!(layer.weight.is_mapped());
    let message = sharded.try_get("big.weight").unwrap_err().to_string();
    assert!(message.contains("model-00002-of-00003.safetensors") && message.contains("does not exist"), "{message}");
}

#[test]
fn unions_refuse_names_defined_twice_and_select_by_prefix() {
    let mut first = Archive::new();
    first.insert("x.weight", Tensor::zeros(DType::F32, &[1]));
    first.insert("y", Tensor::zeros(DType::F32, &[1]));
    let mut second = Archive::new();
    second.insert("x.weight", Tensor::zeros(DType::F32, &[1]));
    let message = Archive::union([first.clone(), second]).unwrap_err().to_string();
    assert!(message.starts_with("`x.weight` is in both"), "{message}");
    assert_eq!(first.select("x").names().collect::<Vec<_>>(), ["x.weight"]);
    assert_eq!(first.select("").len(), 2);
}

#[test]
fn tensors_keep_their_mapping_alive_and_copies_detach() {
    let dir = scratch();
    let path = dir.path().join("alive.safetensors");
    let values: Vec<f32> = (0..64).map(|v| v as f32).collect();
    let mut archive = Archive::new();
    archive.insert("w", Tensor::from_vec(values.clone(), &[8, 8]).unwrap());
    archive.save(&path).unwrap();
    let tensor = Archive::open(&path).unwrap().get("w").unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(tensor.is_mapped(), "the archive is gone but the tensor holds the mapping");
    assert_eq!(tensor.to_vec::<f32>().unwrap(), values);
    let copy = tensor.transpose(0, 1).unwrap().copy();
    assert!(!copy.is_mapped() && copy.is_contiguous() && !copy.shares_storage(&tensor));
    drop(tensor);
    assert_eq!(copy.to_vec::<f32>().unwrap()[..3], [0.0, 8.0, 16.0]);
}

#[test]
fn large_files_with_strided_entries_read_back_exactly() {
    // Large entries are written while their pages are mapped in ahead; strided ones gathered.
    let dir = scratch();
    let path = dir.path().join("large.safetensors");
    let words = 18 << 20; // 72 MiB of u32
    let counter: Vec<u32> = (0..words as u32).collect();
    let square: Vec<u32> = (0..1024 * 1024u32).map(|v| v.wrapping_mul(2_654_435_761)).collect();
    let square = Tensor::from_vec(square, &[1024, 1024]).unwrap();
    let mut archive = Archive::new();
    archive.insert("counter", Tensor::from_vec(counter.clone(), &[words]).unwrap());
    archive.insert("transposed", square.transpose(0, 1).unwrap());
    archive.insert("odd", Tensor::from_vec(vec![7u8; 4097], &[4097]).unwrap());
    archive.save(&path).unwrap();

    let loaded = Archive::open(&path).unwrap();
    assert_eq!(loaded.get("counter").unwrap().to_vec::<u32>().unwrap(), counter);
    assert_eq!(
        loaded.get("transposed").unwrap().to_vec::<u32>().unwrap(),
        square.transpose(0, 1).unwrap().to_vec::<u32>().unwrap()
    );
    assert_eq!(loaded.get("odd").unwrap().to_vec::<u8>().unwrap(), vec![7u8; 4097]);
    // Saving the mapped archive again gives the same bytes.
    let again = dir.path().join("again.safetensors");
    loaded.save(&again).unwrap();
    assert!(std::fs::read(&path).unwrap() == std::fs::read(&again).unwrap());
}

#[test]
fn a_released_entry_reads_the_same_afterwards() {
    // Dropping an entry's mapped pages loses nothing: views made before and reads after see
    // the file's bytes, read again from the file.
    let dir = crate::util::scratch();
    let values: Vec<f32> = (0..300_000).map(|v| (v as f32 * 0.001).sin()).collect();
    let mut archive = nnx::Archive::new();
    archive.insert("big", nnx::Tensor::from_vec(values.clone(), &[600, 500]).unwrap());
    archive.insert("small", nnx::Tensor::from_vec(vec![1f32, 2.0], &[2]).unwrap());
    archive.save(dir.path().join("model.safetensors")).unwrap();
    let opened = nnx::Archive::open(dir.path().join("model.safetensors")).unwrap();
    let before = opened.get("big").unwrap();
    assert_eq!(before.to_vec::<f32>().unwrap(), values);
    opened.release("big");
    opened.release("missing");
    assert_eq!(before.to_vec::<f32>().unwrap(), values);
    assert_eq!(opened.get("big").unwrap().to_vec::<f32>().unwrap(), values);
    assert_eq!(opened.get("small").unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0]);
}
