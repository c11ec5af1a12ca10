//! State dicts: walk order, nesting, partial loads with reports, strict loads that list every
//! problem and leave the module unchanged.

use nnx::nn::Init;

use nnx::{DType, Error, FlatStateDict, LoadOptions, Module, StateNode, Tensor};

use crate::models::{AdamState, Containers, Mlp};

fn snapshot(module: &impl Module) -> Vec<(String, Vec<f32>)> {
    module
        .flat_state_dict()
        .iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(name, t)| (name.to_string(), t.to_vec::<f32>().unwrap()))
        .collect()
}

#[test]
fn flat_state_dicts_follow_declaration_order() {
    let model = Containers::new(Init::Seeded(0));
    let keys: Vec<&str> = model.flat_state_dict().keys().map(|k| k.to_owned().leak() as &str).collect();
    assert_eq!(
        keys,
        [
            "layers.0.fc1.weight",
            "layers.0.fc1.bias",
            "layers.0.fc2.weight",
            "layers.0.fc2.bias",
            "layers.1.fc1.weight",
            "layers.1.fc1.bias",
            "layers.1.fc2.weight",
            "layers.1.fc2.bias",
            "heads.0.weight",
            "heads.1.weight",
            "adapter.weight",
            "adapter.bias",
            "boxed.0.weight",
            "boxed.0.bias",
            "boxed.second.weight",
            "positions",
        ]
    );
    let dict = model.flat_state_dict();
    assert!(dict.get("heads.0.weight").unwrap().shares_storage(&model.heads[0].weight), "state dicts share, not copy");
    assert_eq!(dict.with_prefix("layers.1").len(), 4);
    assert_eq!(dict.with_prefix("layers.1").keys().next(), Some("layers.1.fc1.weight"));
}

#[test]
fn nested_state_dicts_mirror_the_module_tree() {
    let model = AdamState {
        mu: Mlp::new(2, 3, 1, Init::Seeded(1)),
        nu: Mlp::new(2, 3, 1, Init::Zeros),
        step: Tensor::from_vec(vec![3i64], &[]).unwrap(),
    };
    let nested = model.state_dict();
    assert_eq!(nested.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["mu", "nu", "step"]);
    let fc1 = nested.dict("mu").unwrap().dict("fc1").unwrap();
    assert_eq!(fc1.tensor("weight").unwrap().shape(), &[3, 2]);
    assert!(matches!(nested.get("step"), Some(StateNode::Tensor(_))));

    let mut restored = AdamState {
        mu: Mlp::new(2, 3, 1, Init::Zeros),
        nu: Mlp::new(2, 3, 1, Init::Zeros),
        step: Tensor::zeros(DType::I64, &[]),
    };
    restored.load_state_dict_strict(&nested).unwrap();
    assert_eq!(snapshot(&restored.mu), snapshot(&model.mu));
    assert_eq!(restored.step.to_vec::<i64>().unwrap(), [3]);
}

#[test]
fn partial_loads_update_what_is_present_and_report_the_rest() {
    let source = Mlp::new(2, 3, 1, Init::Seeded(4));
    let mut target = Mlp::new(2, 3, 1, Init::Zeros);
    let mut dict = FlatStateDict::new();
    dict.insert("fc1.weight", source.fc1.weight.clone());
    dict.insert("fc3.weight", Tensor::zeros(DType::F32, &[1]));
    let report = target.load_flat_state_dict(&dict).unwrap();
    assert_eq!(report.loaded, ["fc1.weight"]);
    assert_eq!(report.missing, ["fc1.bias", "fc2.weight", "fc2.bias"]);
    assert_eq!(report.unexpected, ["fc3.weight"]);
    assert_eq!(target.fc1.weight.to_vec::<f32>().unwrap(), source.fc1.weight.to_vec::<f32>().unwrap());
    assert_eq!(target.fc2.weight.to_vec::<f32>().unwrap(), vec![0.0; 3]);

    let nested = report_of(&mut target, &source.state_dict().to_flat().with_prefix("fc2"));
    assert_eq!(nested, ["fc2.weight", "fc2.bias"]);
}

fn report_of(target: &mut Mlp, dict: &FlatStateDict) -> Vec<String> {
    target.load_flat_state_dict(dict).unwrap().loaded
}

#[test]
fn partial_loads_refuse_to_load_nothing() {
    let mut target = Mlp::new(2, 3, 1, Init::Zeros);
    let dict = Mlp::new(2, 3, 1, Init::Zeros).flat_state_dict().add_prefix("encoder");
    let message = target.load_flat_state_dict(&dict).unwrap_err().to_string();
    assert!(message.starts_with("cannot load state dict into `Mlp`: 1 problem"), "{message}");
    assert!(message.contains("no key of the state dict matches the module"), "{message}");
    assert!(message.contains("check the prefix"), "{message}");
    let report = target.load_flat_state_dict_with(&dict, &LoadOptions { allow_no_match: true }).unwrap();
    assert!(report.loaded.is_empty());
    assert_eq!(report.unexpected.len(), 4);
}

#[test]
fn partial_loads_still_check_shapes_and_dtypes() {
    let mut target = Mlp::new(2, 3, 1, Init::Zeros);
    let before = snapshot(&target);
    let mut dict = FlatStateDict::new();
    dict.insert("fc1.bias", Tensor::zeros(DType::F32, &[3]));
    dict.insert("fc1.weight", Tensor::zeros(DType::F32, &[2, 3]));
    dict.insert("fc2.bias", Tensor::zeros(DType::BF16, &[1]));
    let error = target.load_flat_state_dict(&dict).unwrap_err();
    insta::assert_snapshot!(error.to_string(), @r"
    cannot load state dict into `Mlp`: 2 problems
      `fc1.weight`: expected shape [3, 2], found [2, 3]
      `fc2.bias`: expected dtype F32, found BF16
    ");
    assert_eq!(snapshot(&target), before);
}

#[test]
fn strict_loads_list_every_problem_with_suggestions() {
    let mut target = Containers::new(Init::Zeros);
    let before = snapshot(&target);
    let mut dict = Containers::new(Init::Seeded(2)).flat_state_dict();
    let weight = dict.remove("layers.1.fc2.weight").unwrap();
    dict.insert("layers.1.fc2.weights", weight);
    dict.remove("positions");
    dict.insert("heads.1.weight", Tensor::zeros(DType::F32, &[3, 4]));
    dict.insert("adapter.bias", Tensor::zeros(DType::F16, &[5]));
    dict.insert("extra.scale", Tensor::zeros(DType::F32, &[1]));
    let error = target.load_flat_state_dict_strict(&dict).unwrap_err();
    let Error::Load(report) = &error else { panic!("expected a load report, got {error}") };
    assert_eq!(report.problems.len(), 6);
    insta::assert_snapshot!(error.to_string(), @r"
    cannot load state dict into `Containers`: 6 problems
      missing `layers.1.fc2.weight` (did you mean `layers.1.fc2.weights`?)
      `heads.1.weight`: expected dtype BF16, found F32
      `adapter.bias`: expected shape [4], found [5]
      missing `positions`
      unexpected `layers.1.fc2.weights` (did you mean `layers.1.fc2.weight`?)
      unexpected `extra.scale`
    ");
    assert_eq!(snapshot(&target), before, "the module is unchanged on failure");
}
