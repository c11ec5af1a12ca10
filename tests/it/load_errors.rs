//! One error path for every load: each way of loading weights (partial and strict state dicts,
//! nested state dicts, `Archive::load_into`, `Archive::import_into`) refuses a misfit as
//! `nnx::Error::Load(report)`, and each kind of import problem comes from a real bad model or
//! file, matched as data rather than text.

use nnx::error::{LoadAction, LoadError, ProblemKind, ProblemSource, SourceOp};
use nnx::nn::{Init, Linear};
use nnx::{Archive, DType, Error, FlatStateDict, ImportOptions, Module, StateDict, Tensor, TensorParallel};

use crate::util::scratch;

/// What a program that uses `?` sees: the nnx error of any load path.
fn through_question_mark<T>(load: impl FnOnce() -> Result<T, nnx::Error>) -> Error {
    let run = || -> nnx::Result<T> { load() };
    match run() {
        Ok(_) => panic!("the load was expected to fail"),
        Err(error) => error,
    }
}

/// The report of a refused load, or a panic naming the error.
fn report(error: Error) -> LoadError {
    match error {
        Error::Load(report) => report,
        other => panic!("expected `Error::Load`, got {other:?}"),
    }
}

fn layer() -> Linear {
    Linear::builder(2, 3).init(Init::Zeros).build()
}

#[test]
fn a_partial_load_that_matches_nothing_is_a_load_error() {
    let mut target = layer();
    let dict = layer().flat_state_dict().add_prefix("encoder");
    let report = report(through_question_mark(|| target.load_flat_state_dict(&dict)));
    assert_eq!(report.action, LoadAction::Load);
    let [ProblemKind::NoMatch { module_keys, source_keys }] = report.kinds().collect::<Vec<_>>()[..] else {
        panic!("{report}")
    };
    assert_eq!(module_keys, &["weight", "bias"]);
    assert_eq!(source_keys, &["encoder.weight", "encoder.bias"]);
}

#[test]
fn a_load_under_a_misspelt_prefix_names_the_prefix_the_file_has() {
    let archive = Archive::from_module(&layer(), "model.encoder");
    let mut target = layer();
    let misspelt = report(archive.load_into(&mut target, "model.encodr").unwrap_err());
    let kinds: Vec<_> = misspelt.kinds().collect();
    assert_eq!(
        kinds[0],
        &ProblemKind::PrefixNotFound { prefix: "model.encodr".into(), suggestion: Some("model.encoder".into()) }
    );
    assert!(misspelt.to_string().contains("did you mean `model.encoder`?"), "{misspelt}");
    // The file without a prefix, asked with one.
    let archive = Archive::from_module(&layer(), "");
    let unprefixed = report(archive.load_into(&mut target, "model").unwrap_err());
    assert_eq!(
        unprefixed.kinds().next(),
        Some(&ProblemKind::PrefixNotFound { prefix: "model".into(), suggestion: Some(String::new()) })
    );
    // Nothing of the model anywhere: no suggestion.
    let archive = archive_of(&[("other.thing", DType::F32, &[2])]);
    let elsewhere = report(archive.load_into(&mut target, "model").unwrap_err());
    assert_eq!(
        elsewhere.kinds().next(),
        Some(&ProblemKind::PrefixNotFound { prefix: "model".into(), suggestion: None })
    );
}

#[test]
fn a_strict_state_dict_load_is_a_load_error() {
    let mut target = layer();
    let mut dict = layer().flat_state_dict();
    let weight = dict.remove("weight").unwrap();
    dict.insert("weights", weight);
    dict.insert("bias", Tensor::zeros(DType::F16, &[3]));
    let report = report(through_question_mark(|| target.load_flat_state_dict_strict(&dict)));
    let problems: Vec<(&str, &ProblemKind)> = report.problems.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
    assert_eq!(
        problems,
        [
            ("weight", &ProblemKind::Missing { suggestion: Some("weights".into()) }),
            ("bias", &ProblemKind::DType { expected: DType::F32, found: DType::F16 }),
            ("weights", &ProblemKind::Unexpected { suggestion: Some("weight".into()) }),
        ]
    );
}

#[test]
fn a_nested_state_dict_load_is_a_load_error() {
    let mut target = layer();
    let mut flat = layer().flat_state_dict();
    flat.insert("weight", Tensor::zeros(DType::F32, &[2, 3]));
    let nested = StateDict::from_flat(&flat);
    let report = report(through_question_mark(|| target.load_state_dict(&nested)));
    let [problem] = &report.problems[..] else { panic!("{report}") };
    assert_eq!(problem.name, "weight");
    assert_eq!(problem.kind, ProblemKind::Shape { expected: vec![3, 2], found: vec![2, 3] });
}

#[test]
fn an_archive_load_is_a_load_error() {
    let dir = scratch();
    let path = dir.path().join("layer.safetensors");
    let mut archive = Archive::new();
    archive.insert("model.weight", Tensor::zeros(DType::F32, &[3, 2]));
    archive.insert("model.bias", Tensor::zeros(DType::F32, &[4]));
    archive.insert("model.extra", Tensor::zeros(DType::F32, &[1]));
    archive.save(&path).unwrap();
    let mut target = layer();
    let report = report(Archive::open(&path).unwrap().load_into(&mut target, "model").unwrap_err());
    let kinds: Vec<&ProblemKind> = report.kinds().collect();
    assert_eq!(
        kinds,
        [&ProblemKind::Shape { expected: vec![3], found: vec![4] }, &ProblemKind::Unexpected { suggestion: None },]
    );
    assert_eq!(report.problems[1].name, "model.extra");
}

#[test]
fn an_import_is_a_load_error_with_its_source() {
    let mut archive = Archive::new();
    archive.insert("weight", Tensor::zeros(DType::F32, &[3, 2]));
    let mut target = layer();
    let report = report(archive.import_into(&mut target, "").unwrap_err());
    assert_eq!(report.action, LoadAction::Import);
    let [problem] = &report.problems[..] else { panic!("{report}") };
    assert_eq!(problem.name, "bias");
    assert_eq!(problem.kind, ProblemKind::Missing { suggestion: None });
    assert_eq!(problem.source, Some(ProblemSource::Entry { name: "bias".into(), stored: None, ops: vec![] }));
}

// One model per import problem, each a field or two of raw tensors.

#[derive(Module)]
struct Cut {
    #[nnx(from = "fused", split(axis = 0, parts = 3, index = 1), transpose)]
    piece: Tensor,
}

#[derive(Module)]
struct FarCut {
    #[nnx(from = "fused", split(axis = 4, parts = 2, index = 0))]
    piece: Tensor,
}

#[derive(Module)]
struct Plain {
    weight: Tensor,
}

#[derive(Module)]
struct Required {
    #[nnx(dtype = "i64")]
    positions: Tensor,
}

#[derive(Module)]
struct Tied {
    weight: Tensor,
    #[nnx(tie = "weight")]
    head: Tensor,
}

#[derive(Module)]
struct TiedAway {
    weight: Tensor,
    #[nnx(tie = "encoder.weigth_x")]
    head: Tensor,
}

#[derive(Module)]
struct Layer {
    weight: Tensor,
}

#[derive(Module)]
struct Stack {
    #[nnx(from = "model.h")]
    h: Vec<Layer>,
}

fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
    Tensor::zeros(dtype, shape)
}

fn archive_of(entries: &[(&str, DType, &[usize])]) -> Archive {
    let mut archive = Archive::new();
    for (name, dtype, shape) in entries {
        archive.insert(*name, zeros(*dtype, shape));
    }
    archive
}

/// The kinds of the problems of importing `module` from `archive` with `options`.
fn import_kinds(archive: &Archive, module: &mut impl Module, options: &ImportOptions) -> Vec<ProblemKind> {
    let report = report(archive.import_into_with(module, "", options).unwrap_err());
    assert_eq!(report.action, LoadAction::Import);
    report.problems.into_iter().map(|problem| problem.kind).collect()
}

fn kinds(archive: &Archive, module: &mut impl Module) -> Vec<ProblemKind> {
    import_kinds(archive, module, &ImportOptions::default())
}

#[test]
fn a_split_that_does_not_divide_names_axis_size_and_parts() {
    let archive = archive_of(&[("fused", DType::F32, &[4, 2])]);
    let mut model = Cut { piece: zeros(DType::F32, &[2, 1]) };
    let report = report(archive.import_into(&mut model, "").unwrap_err());
    let [problem] = &report.problems[..] else { panic!("{report}") };
    assert_eq!(problem.kind, ProblemKind::NotDivisible { axis: 0, size: 4, parts: 3 });
    assert_eq!(
        problem.source,
        Some(ProblemSource::Entry {
            name: "fused".into(),
            stored: Some((DType::F32, vec![4, 2])),
            ops: vec![SourceOp::Split { axis: 0, index: 1, parts: 3 }, SourceOp::Transpose],
        })
    );
    assert_eq!(
        problem.to_string(),
        "piece <- fused [4, 2] split(0, 2/3) transpose: axis 0 of size 4 does not divide into 3 pieces"
    );
}

#[test]
fn a_split_along_an_axis_the_entry_lacks() {
    let archive = archive_of(&[("fused", DType::F32, &[4, 2])]);
    let mut model = FarCut { piece: zeros(DType::F32, &[2, 2]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::SplitAxisOutOfRange { axis: 4, rank: 2 }]);
}

#[test]
fn a_sub_byte_entry_cannot_be_split_or_transposed() {
    let archive = archive_of(&[("fused", DType::F4, &[6, 2])]);
    let mut model = Cut { piece: zeros(DType::F4, &[2, 2]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::SubByte { dtype: DType::F4 }]);
}

#[test]
fn a_shape_that_does_not_fit_after_the_ops() {
    // [6, 4] split into 3 along axis 0 is [2, 4], transposed [4, 2].
    let archive = archive_of(&[("fused", DType::F32, &[6, 4])]);
    let mut model = Cut { piece: zeros(DType::F32, &[2, 4]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::Shape { expected: vec![2, 4], found: vec![4, 2] }]);
}

#[test]
fn a_dtype_that_does_not_cast() {
    let archive = archive_of(&[("weight", DType::I32, &[2])]);
    let mut model = Plain { weight: zeros(DType::F32, &[2]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::NotCastable { expected: DType::F32, found: DType::I32 }]);
}

#[test]
fn a_field_that_requires_its_dtype() {
    let archive = archive_of(&[("positions", DType::I32, &[2])]);
    let mut model = Required { positions: zeros(DType::I64, &[2]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::RequiredDType { required: DType::I64, found: DType::I32 }]);
}

#[test]
fn a_missing_entry_suggests_a_near_name() {
    let archive = archive_of(&[("weights", DType::F32, &[2])]);
    let mut model = Plain { weight: zeros(DType::F32, &[2]) };
    assert_eq!(kinds(&archive, &mut model), [ProblemKind::Missing { suggestion: Some("weights".into()) }]);
}

#[test]
fn a_missing_layer_is_reported_once_with_what_the_file_has() {
    let archive = archive_of(&[("model.h.0.weight", DType::F32, &[2]), ("model.h.1.weight", DType::F32, &[2])]);
    let mut model = Stack { h: (0..4).map(|_| Layer { weight: zeros(DType::F32, &[2]) }).collect() };
    let report = report(archive.import_into(&mut model, "").unwrap_err());
    let found: Vec<(&str, &ProblemKind)> = report.problems.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
    let subtree = ProblemKind::MissingSubtree { parent: "model.h".into(), present: Some((0, 1)) };
    assert_eq!(found, [("h.2", &subtree), ("h.3", &subtree)]);
}

#[test]
fn ties_to_a_missing_or_mismatched_tensor() {
    let archive = archive_of(&[("weight", DType::F32, &[2])]);
    let mut model = Tied { weight: zeros(DType::F32, &[2]), head: zeros(DType::F32, &[3]) };
    assert_eq!(
        kinds(&archive, &mut model),
        [ProblemKind::TieMismatch {
            expected_dtype: DType::F32,
            expected_shape: vec![3],
            found_dtype: DType::F32,
            found_shape: vec![2],
        }]
    );
    let mut model = TiedAway { weight: zeros(DType::F32, &[2]), head: zeros(DType::F32, &[2]) };
    assert_eq!(
        kinds(&archive, &mut model),
        [ProblemKind::TieTargetMissing { target: "encoder.weigth_x".into(), suggestion: None }]
    );
}

#[test]
fn a_placement_that_does_not_cut_evenly() {
    let archive = archive_of(&[("weight", DType::F32, &[4])]);
    let mut model = Plain { weight: zeros(DType::F32, &[4]) };
    let placement = TensorParallel { world_size: 3, rank: 0, column: vec!["**".into()], row: vec![] };
    let options = ImportOptions::default().with_placement(placement);
    assert_eq!(
        import_kinds(&archive, &mut model, &options),
        [ProblemKind::NotDivisibleForRank { axis: 0, size: 4, world_size: 3, rank: 0 }]
    );
}

#[test]
fn strict_coverage_refuses_unused_entries() {
    let archive = archive_of(&[("weight", DType::F32, &[2]), ("extra", DType::F32, &[1])]);
    let mut model = Plain { weight: zeros(DType::F32, &[2]) };
    let options = ImportOptions::default().with_strict_coverage();
    let report = report(archive.import_into_with(&mut model, "", &options).unwrap_err());
    let [problem] = &report.problems[..] else { panic!("{report}") };
    assert_eq!((problem.name.as_str(), &problem.kind), ("extra", &ProblemKind::Unused));
}

#[test]
fn hooks_for_no_tensor_or_reading_no_entry() {
    let archive = archive_of(&[("weight", DType::F32, &[2])]);
    let mut model = Plain { weight: zeros(DType::F32, &[2]) };
    let options = ImportOptions::default()
        .hook("weigth", Vec::<String>::new(), |archive, _| archive.try_get("weight"))
        .hook("weight", ["absent"], |archive, _| archive.try_get("weight"));
    assert_eq!(
        import_kinds(&archive, &mut model, &options),
        [ProblemKind::HookTargetMissing { suggestion: Some("weight".into()) }, ProblemKind::HookReadMissing]
    );
}

#[test]
fn hooks_that_fail_or_return_the_wrong_tensor() {
    let archive = archive_of(&[("weight", DType::F32, &[2])]);
    let mut model = Tied { weight: zeros(DType::F32, &[2]), head: zeros(DType::F32, &[2]) };
    let options = ImportOptions::default().hook("weight", ["weight"], |archive, _| archive.try_get("nothing"));
    let kinds = import_kinds(&archive, &mut model, &options);
    let [ProblemKind::HookFailed { error }] = &kinds[..] else { panic!("{kinds:?}") };
    assert!(error.to_string().contains("nothing"), "{error}");

    let options = ImportOptions::default().hook("weight", ["weight"], |_, _| Ok(Tensor::zeros(DType::F16, &[5])));
    assert_eq!(
        import_kinds(&archive, &mut model, &options),
        [ProblemKind::HookMismatch {
            expected_dtype: DType::F32,
            expected_shape: vec![2],
            found_dtype: DType::F16,
            found_shape: vec![5],
        }]
    );
    assert!(model.weight.to_vec::<f32>().is_ok(), "a refused import leaves the model as it was");
}

#[test]
fn a_load_error_from_the_tensor_crate_converts_to_the_same_variant() {
    let mut target = layer();
    let dict = FlatStateDict::new();
    let error: Error = target.load_flat_state_dict_strict(&dict).unwrap_err();
    assert!(matches!(error, Error::Load(_)), "{error:?}");
}

#[test]
fn a_strict_load_returns_the_one_error_of_nnx() {
    // The strict load of a state dict is a tensor-crate function; its error is `nnx::Error`
    // itself, matched without conversion.
    let mut target = layer();
    let dict = layer().flat_state_dict().add_prefix("encoder");
    let strict = target.load_flat_state_dict_strict(&dict);
    assert!(matches!(strict, Err(nnx::Error::Load(..))), "{strict:?}");
    // A tensor operation and an archive read fail with the same type.
    let reshape: nnx::Result<Tensor> = Tensor::zeros(DType::F32, &[2, 3]).reshape(&[4]);
    assert!(matches!(reshape, Err(nnx::Error::Reshape { .. })), "{reshape:?}");
    let missing = Archive::open(scratch().path().join("missing.safetensors"));
    assert!(matches!(missing, Err(nnx::Error::Io { .. })), "{:?}", missing.err());
}
