//! State dicts (flat and nested), partial and strict loads, and the name matching with
//! did-you-mean suggestions that every strict loader shares.

use std::collections::{HashMap, HashSet};

use crate::error::{LoadAction, LoadError, Problem, ProblemKind, Result};
use crate::module::{Module, for_each_entry, for_each_entry_mut};
use crate::{DType, Tensor};

/// Tensors keyed by full path (`blocks.2.attn.q.weight`), in insertion order.
#[derive(Clone, Debug, Default)]
pub struct FlatStateDict {
    entries: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
}

impl FlatStateDict {
    /// An empty dict.
    pub fn new() -> FlatStateDict {
        FlatStateDict::default()
    }

    /// Adds `tensor` under `key`, replacing (in place) a tensor already there.
    pub fn insert(&mut self, key: impl Into<String>, tensor: Tensor) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&at) => self.entries[at].1 = tensor,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, tensor));
            }
        }
    }

    /// Removes and returns the tensor under `key`.
    pub fn remove(&mut self, key: &str) -> Option<Tensor> {
        let at = self.index.remove(key)?;
        let (_, tensor) = self.entries.remove(at);
        for position in self.index.values_mut() {
            if *position > at {
                *position -= 1;
            }
        }
        Some(tensor)
    }

    /// The tensor under `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.index.get(key).map(|&at| &self.entries[at].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(key, _)| key.as_str())
    }

    /// Keys and tensors in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(key, tensor)| (key.as_str(), tensor))
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries named `prefix` or `prefix.*`, with their names kept whole.
    pub fn with_prefix(&self, prefix: &str) -> FlatStateDict {
        self.iter()
            .filter(|(key, _)| under_prefix(key, prefix).is_some())
            .map(|(key, tensor)| (key.to_string(), tensor.clone()))
            .collect()
    }

    /// The entries under `prefix.` with the prefix removed (all entries for `""`).
    pub fn strip_prefix(&self, prefix: &str) -> FlatStateDict {
        self.iter()
            .filter_map(|(key, tensor)| {
                under_prefix(key, prefix).filter(|rest| !rest.is_empty()).map(|rest| (rest.to_string(), tensor.clone()))
            })
            .collect()
    }

    /// Every entry with `prefix.` put before its name (unchanged for `""`).
    pub fn add_prefix(&self, prefix: &str) -> FlatStateDict {
        self.iter().map(|(key, tensor)| (join(prefix, key), tensor.clone())).collect()
    }
}

impl FromIterator<(String, Tensor)> for FlatStateDict {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        let mut dict = FlatStateDict::new();
        for (key, tensor) in iter {
            dict.insert(key, tensor);
        }
        dict
    }
}

impl IntoIterator for FlatStateDict {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

/// `prefix.rest` -> `Some(rest)`, `prefix` -> `Some("")`, anything else `None`; the empty
/// prefix owns every name.
pub fn under_prefix<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(name);
    }
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() { Some("") } else { rest.strip_prefix('.') }
}

/// `prefix` and `name` joined by `.`, or `name` alone for the empty prefix.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else if name.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A node of a nested state dict.
#[derive(Clone, Debug)]
pub enum StateNode {
    /// A tensor at this path.
    Tensor(Tensor),
    /// A sub-dictionary (a submodule, a list element).
    Dict(StateDict),
}

/// Tensors as a tree keyed by path segment, in walk order, like a PyTorch or Flax nested state.
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    entries: Vec<(String, StateNode)>,
}

impl StateDict {
    /// An empty dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Builds the tree from dotted keys, keeping their order.
    pub fn from_flat(flat: &FlatStateDict) -> StateDict {
        let mut root = StateDict::new();
        for (key, tensor) in flat.iter() {
            let segments: Vec<&str> = key.split('.').collect();
            root.insert_path(&segments, tensor.clone());
        }
        root
    }

    fn insert_path(&mut self, segments: &[&str], tensor: Tensor) {
        let (first, rest) = segments.split_first().expect("keys have at least one segment");
        if rest.is_empty() {
            self.entries.push((first.to_string(), StateNode::Tensor(tensor)));
            return;
        }
        let child = match self.entries.iter().position(|(key, node)| key == first && matches!(node, StateNode::Dict(_)))
        {
            Some(at) => at,
            None => {
                self.entries.push((first.to_string(), StateNode::Dict(StateDict::new())));
                self.entries.len() - 1
            }
        };
        if let StateNode::Dict(dict) = &mut self.entries[child].1 {
            dict.insert_path(rest, tensor);
        }
    }

    /// The dotted keys and tensors, in order.
    pub fn to_flat(&self) -> FlatStateDict {
        let mut flat = FlatStateDict::new();
        self.flatten_into("", &mut flat);
        flat
    }

    fn flatten_into(&self, prefix: &str, flat: &mut FlatStateDict) {
        for (key, node) in &self.entries {
            let path = join(prefix, key);
            match node {
                StateNode::Tensor(tensor) => flat.insert(path, tensor.clone()),
                StateNode::Dict(dict) => dict.flatten_into(&path, flat),
            }
        }
    }

    /// The node under one segment.
    pub fn get(&self, segment: &str) -> Option<&StateNode> {
        self.entries.iter().find(|(key, _)| key == segment).map(|(_, node)| node)
    }

    /// The sub-dictionary under one segment.
    pub fn dict(&self, segment: &str) -> Option<&StateDict> {
        match self.get(segment) {
            Some(StateNode::Dict(dict)) => Some(dict),
            _ => None,
        }
    }

    /// The tensor under one segment.
    pub fn tensor(&self, segment: &str) -> Option<&Tensor> {
        match self.get(segment) {
            Some(StateNode::Tensor(tensor)) => Some(tensor),
            _ => None,
        }
    }

    /// Segments and nodes in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &StateNode)> {
        self.entries.iter().map(|(key, node)| (key.as_str(), node))
    }

    /// The number of direct children.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a partial load did, key by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Module keys replaced from the source, in walk order.
    pub loaded: Vec<String>,
    /// Module keys the source lacks, which kept their values, in walk order.
    pub missing: Vec<String>,
    /// Source keys the module lacks, in the source's order.
    pub unexpected: Vec<String>,
}

/// Options of partial loads.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Accept a load where no key matches (by default that is an error, because it almost
    /// always means a wrong prefix).
    pub allow_no_match: bool,
}

/// A named tensor's dtype and shape, as read from a module or a file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Full key.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

/// The specs of every tensor of `module`, in walk order.
pub fn module_specs<M: Module + ?Sized>(module: &M) -> Vec<TensorSpec> {
    let mut specs = Vec::new();
    for_each_entry(module, |entry, tensor| {
        specs.push(TensorSpec { name: entry.name.to_string(), dtype: tensor.dtype(), shape: tensor.shape().to_vec() });
    });
    specs
}

/// The closest of `candidates` to `name`, when it is close enough to be a likely typo.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (name.chars().count() / 3).clamp(1, 4);
    candidates
        .into_iter()
        .map(|candidate| (strsim::levenshtein(name, candidate), candidate))
        .filter(|&(distance, _)| distance > 0 && distance <= limit)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate.to_string())
}

/// Every problem between what a module expects and what a source holds: dtype and shape
/// mismatches of shared names, and, when `strict`, missing and unexpected names with
/// suggestions. Module order first, then the source's order for unexpected names.
pub fn compare_specs(expected: &[TensorSpec], found: &[TensorSpec], strict: bool) -> Vec<Problem> {
    let found_by_name: HashMap<&str, &TensorSpec> = found.iter().map(|spec| (spec.name.as_str(), spec)).collect();
    let expected_names: HashSet<&str> = expected.iter().map(|spec| spec.name.as_str()).collect();
    let unexpected: Vec<&str> =
        found.iter().map(|spec| spec.name.as_str()).filter(|name| !expected_names.contains(name)).collect();
    // An unexpected name is most likely a typo of the module name nearest to it; a missing
    // name is suggested only the unexpected names that point back at it.
    let nearest: Vec<(&str, Option<String>)> =
        unexpected.iter().map(|name| (*name, suggest(name, expected.iter().map(|spec| spec.name.as_str())))).collect();
    let mut problems = Vec::new();
    for spec in expected {
        match found_by_name.get(spec.name.as_str()) {
            None if strict => problems.push(Problem::new(
                &spec.name,
                ProblemKind::Missing {
                    suggestion: suggest(
                        &spec.name,
                        nearest.iter().filter(|(_, near)| near.as_deref() == Some(&spec.name)).map(|(name, _)| *name),
                    ),
                },
            )),
            None => {}
            Some(other) if other.dtype != spec.dtype => {
                problems.push(Problem::new(&spec.name, ProblemKind::DType { expected: spec.dtype, found: other.dtype }))
            }
            Some(other) if other.shape != spec.shape => problems.push(Problem::new(
                &spec.name,
                ProblemKind::Shape { expected: spec.shape.clone(), found: other.shape.clone() },
            )),
            Some(_) => {}
        }
    }
    if strict {
        for (name, suggestion) in nearest {
            problems.push(Problem::new(name, ProblemKind::Unexpected { suggestion }));
        }
    }
    problems
}

fn dict_specs(dict: &FlatStateDict) -> Vec<TensorSpec> {
    dict.iter()
        .map(|(name, tensor)| TensorSpec {
            name: name.to_string(),
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
        })
        .collect()
}

/// Replaces every module tensor whose name `dict` holds by the dict's tensor.
fn assign<M: Module + ?Sized>(module: &mut M, dict: &FlatStateDict) {
    for_each_entry_mut(module, |entry, tensor| {
        if let Some(source) = dict.get(entry.name) {
            *tensor = source.clone();
        }
    });
}

pub(crate) fn flat_state_dict<M: Module + ?Sized>(module: &M) -> FlatStateDict {
    let mut dict = FlatStateDict::new();
    for_each_entry(module, |entry, tensor| dict.insert(entry.name, tensor.clone()));
    dict
}

/// The report of a refused state-dict load into `module`.
fn state_dict_error<M: Module + ?Sized>(module: &M, problems: Vec<Problem>) -> crate::Error {
    LoadError { action: LoadAction::Load, source: "state dict".into(), target: module.module_name().into(), problems }
        .into()
}

pub(crate) fn load_flat<M: Module + ?Sized>(
    module: &mut M,
    dict: &FlatStateDict,
    options: &LoadOptions,
) -> Result<LoadReport> {
    let expected = module_specs(module);
    let found = dict_specs(dict);
    let problems = compare_specs(&expected, &found, false);
    if !problems.is_empty() {
        return Err(state_dict_error(module, problems));
    }
    let mut report = LoadReport::default();
    let expected_names: HashSet<&str> = expected.iter().map(|spec| spec.name.as_str()).collect();
    for spec in &expected {
        if dict.contains_key(&spec.name) {
            report.loaded.push(spec.name.clone());
        } else {
            report.missing.push(spec.name.clone());
        }
    }
    report.unexpected = dict.keys().filter(|key| !expected_names.contains(key)).map(str::to_string).collect();
    if report.loaded.is_empty() && !options.allow_no_match {
        let kind = ProblemKind::NoMatch {
            module_keys: expected.iter().take(3).map(|spec| spec.name.clone()).collect(),
            source_keys: dict.keys().take(3).map(str::to_string).collect(),
        };
        return Err(state_dict_error(module, vec![Problem::new("", kind)]));
    }
    assign(module, dict);
    Ok(report)
}

pub(crate) fn load_flat_strict<M: Module + ?Sized>(module: &mut M, dict: &FlatStateDict) -> Result<()> {
    let problems = compare_specs(&module_specs(module), &dict_specs(dict), true);
    if !problems.is_empty() {
        return Err(state_dict_error(module, problems));
    }
    assign(module, dict);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_own_whole_segments() {
        assert_eq!(under_prefix("model.fc.weight", "model"), Some("fc.weight"));
        assert_eq!(under_prefix("model", "model"), Some(""));
        assert_eq!(under_prefix("models.fc", "model"), None);
        assert_eq!(under_prefix("x", ""), Some("x"));
    }

    #[test]
    fn suggestions_catch_typos_only() {
        assert_eq!(suggest("fc1.weight", ["fc1.weights", "fc2.bias"]).as_deref(), Some("fc1.weights"));
        assert_eq!(suggest("fc1.weight", ["embed.table"]), None);
    }

    #[test]
    fn nested_dicts_round_trip_in_order() {
        let mut flat = FlatStateDict::new();
        for key in ["b.x", "a", "b.y.z", "c.0.w"] {
            flat.insert(key, Tensor::zeros(DType::F32, &[1]));
        }
        let nested = StateDict::from_flat(&flat);
        assert_eq!(nested.iter().map(|(key, _)| key).collect::<Vec<_>>(), ["b", "a", "c"]);
        assert!(nested.dict("b").unwrap().dict("y").unwrap().tensor("z").is_some());
        assert_eq!(nested.to_flat().keys().collect::<Vec<_>>(), ["b.x", "b.y.z", "a", "c.0.w"]);
    }
}
