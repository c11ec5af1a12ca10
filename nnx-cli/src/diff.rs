//! `nnx diff A B [--json] [--atol X]`: the tensors of two checkpoints of any format compared
//! entry by entry: names only in one of them, dtype or shape differences, and for the common
//! tensors the largest absolute difference and the count of differing elements. A GGUF
//! block type (`Q8_0`) is compared as the floats it decodes to, and shown as stored.

use std::path::{Path, PathBuf};

use nnx::text::printable;
use nnx::{Archive, DType, EntryInfo, Tensor};

use crate::common::{CliError, open_archive};

/// The arguments of `nnx diff`.
#[derive(clap::Args)]
pub struct Args {
    /// The first checkpoint (any format or `hf://` path `convert` reads).
    a: PathBuf,
    /// The second checkpoint.
    b: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Float elements differ when `|a - b|` exceeds this; integers and bools must be equal.
    #[arg(long, default_value_t = 0.0, value_name = "X", value_parser = parse_tolerance)]
    atol: f64,
}

/// Parses `--atol`: a finite number, zero or more.
pub fn parse_tolerance(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!("`{text}` is not a tolerance: give a finite number, zero or more")),
    }
}

/// The elements of a tensor in the form they are compared in.
enum Values {
    /// Float elements, widened to f64 (exactly).
    Float(Vec<f64>),
    /// Integer and bool elements, exactly.
    Integer(Vec<i128>),
    /// Elements of a dtype without arithmetic here (8-bit and smaller floats), as their bytes.
    Bytes {
        /// The dtype: bytes are compared only with bytes of the same dtype.
        dtype: DType,
        /// The row-major bytes.
        bytes: Vec<u8>,
    },
}

fn values(tensor: &Tensor) -> nnx::Result<Values> {
    fn integers<T: nnx::Element + Into<i128>>(tensor: &Tensor) -> nnx::Result<Values> {
        Ok(Values::Integer(tensor.to_vec::<T>()?.into_iter().map(Into::into).collect()))
    }
    Ok(match tensor.dtype() {
        dtype if dtype.is_castable_float() => Values::Float(tensor.to_dtype(DType::F64)?.to_vec::<f64>()?),
        DType::Bool => Values::Integer(tensor.to_vec::<bool>()?.into_iter().map(i128::from).collect()),
        DType::U8 => integers::<u8>(tensor)?,
        DType::I8 => integers::<i8>(tensor)?,
        DType::U16 => integers::<u16>(tensor)?,
        DType::I16 => integers::<i16>(tensor)?,
        DType::U32 => integers::<u32>(tensor)?,
        DType::I32 => integers::<i32>(tensor)?,
        DType::U64 => integers::<u64>(tensor)?,
        DType::I64 => integers::<i64>(tensor)?,
        dtype => Values::Bytes { dtype, bytes: tensor.to_bytes()?.into_owned() },
    })
}

/// How far apart two common tensors are.
struct Compared {
    /// The largest `|a - b|`; infinite when a NaN meets a number or infinities differ.
    max_abs_diff: f64,
    /// The elements that differ (by more than the tolerance for floats).
    differing: u64,
}

/// `|a - b|` for floats, with NaN equal to NaN and infinite against anything else.
fn float_distance(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        0.0
    } else if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        (a - b).abs()
    }
}

fn compare_floats(a: &[f64], b: &[f64], atol: f64) -> Compared {
    let mut compared = Compared { max_abs_diff: 0.0, differing: 0 };
    for (&a, &b) in a.iter().zip(b) {
        let distance = float_distance(a, b);
        compared.max_abs_diff = compared.max_abs_diff.max(distance);
        if distance > atol {
            compared.differing += 1;
        }
    }
    compared
}

/// Compares two tensors of one shape; `None` when their elements cannot be compared (one holds
/// floats of a dtype without arithmetic, the other a different dtype).
fn compare(a: &Values, b: &Values, atol: f64) -> Option<Compared> {
    let widen = |values: &[i128]| values.iter().map(|&value| value as f64).collect::<Vec<f64>>();
    Some(match (a, b) {
        (Values::Float(a), Values::Float(b)) => compare_floats(a, b, atol),
        (Values::Float(a), Values::Integer(b)) => compare_floats(a, &widen(b), atol),
        (Values::Integer(a), Values::Float(b)) => compare_floats(&widen(a), b, atol),
        (Values::Integer(a), Values::Integer(b)) => {
            let mut compared = Compared { max_abs_diff: 0.0, differing: 0 };
            for (&a, &b) in a.iter().zip(b) {
                if a != b {
                    compared.differing += 1;
                    compared.max_abs_diff = compared.max_abs_diff.max((a - b).unsigned_abs() as f64);
                }
            }
            compared
        }
        (Values::Bytes { dtype: a_dtype, bytes: a }, Values::Bytes { dtype: b_dtype, bytes: b })
            if a_dtype == b_dtype && a.len() == b.len() =>
        {
            // Elements packed below a byte are counted by the bytes that hold them.
            let width = a_dtype.size_in_bytes().unwrap_or(1).max(1);
            let differing = a.chunks(width).zip(b.chunks(width)).filter(|(a, b)| a != b).count();
            // No arithmetic on these dtypes: the largest difference is left undefined.
            Compared { max_abs_diff: if differing == 0 { 0.0 } else { f64::NAN }, differing: differing as u64 }
        }
        _ => return None,
    })
}

/// One name the two checkpoints share.
struct Common {
    name: String,
    a: EntryInfo,
    b: EntryInfo,
    /// The ggml block types the entries are stored as (`Q8_0`), when they are: their `dtype`
    /// is the dtype they decode to and are compared as.
    a_stored: Option<&'static str>,
    b_stored: Option<&'static str>,
    /// `None` when the shapes differ or the elements cannot be compared.
    compared: Option<Compared>,
}

impl Common {
    fn layout_differs(&self) -> bool {
        self.a.dtype != self.b.dtype || self.a.shape != self.b.shape
    }

    fn values_differ(&self) -> bool {
        self.compared.as_ref().is_some_and(|compared| compared.differing > 0)
    }
}

/// The comparison of two checkpoints.
struct Report {
    only_in_a: Vec<String>,
    only_in_b: Vec<String>,
    common: Vec<Common>,
}

impl Report {
    fn equal(&self) -> bool {
        self.only_in_a.is_empty()
            && self.only_in_b.is_empty()
            && self.common.iter().all(|common| !common.layout_differs() && !common.values_differ())
    }
}

fn entry_values(archive: &Archive, name: &str, path: &Path) -> Result<Values, CliError> {
    let tensor = archive.try_get(name)?;
    values(&tensor).map_err(|error| {
        let (name, path) = (printable(name), path.display());
        CliError(match crate::convert::expansion(&error) {
            Some(layout) => format!(
                "cannot compare `{name}` of `{path}`: {layout}: save the tensor contiguous and compare that file"
            ),
            None => format!("cannot read `{name}` of `{path}`: {error}"),
        })
    })
}

/// The elements of a shape, saturating at `u64::MAX` (a header may describe more than any file
/// holds).
fn elements(shape: &[usize]) -> u64 {
    if shape.contains(&0) {
        return 0;
    }
    shape.iter().fold(1u64, |product, &size| product.saturating_mul(size as u64))
}

/// Runs the command; returns the report and whether the checkpoints are equal.
pub fn run(args: Args) -> Result<(String, bool), CliError> {
    let Args { a, b, json, atol } = args;
    let ((a_path, a), (b_path, b)) = (open_archive(a)?, open_archive(b)?);
    let (a_path, b_path) = (&a_path, &b_path);
    let mut report = Report { only_in_a: Vec::new(), only_in_b: Vec::new(), common: Vec::new() };
    for name in a.names() {
        if !b.contains(name) {
            report.only_in_a.push(name.to_string());
            continue;
        }
        let (a_info, b_info) = (a.info(name)?, b.info(name)?);
        let compared = if a_info.shape == b_info.shape {
            let (a_values, b_values) = (entry_values(&a, name, a_path)?, entry_values(&b, name, b_path)?);
            compare(&a_values, &b_values, atol)
        } else {
            None
        };
        let (a_stored, b_stored) = (block_type(&a, name), block_type(&b, name));
        report.common.push(Common { name: name.to_string(), a: a_info, b: b_info, a_stored, b_stored, compared });
    }
    report.only_in_b = b.names().filter(|name| !a.contains(name)).map(str::to_string).collect();
    let equal = report.equal();
    let text =
        if json { render_json(&report, a_path, b_path, atol) + "\n" } else { render_text(&report, a_path, b_path) };
    Ok((text, equal))
}

/// The ggml block type entry `name` of `archive` is stored as; `None` for entries stored as
/// their dtype (every SafeTensors entry, and GGUF's F32, F16 and BF16).
fn block_type(archive: &Archive, name: &str) -> Option<&'static str> {
    archive.ggml_type(name).filter(|ty| ty.is_quantized()).map(|ty| ty.name())
}

/// An entry's type as stored (the ggml block type, or the dtype) and shape.
fn layout(info: &EntryInfo, stored: Option<&str>) -> String {
    match stored {
        Some(ty) => format!("{ty} {:?}", info.shape),
        None => format!("{} {:?}", info.dtype, info.shape),
    }
}

fn number(value: f64) -> String {
    if value.is_nan() { "-".into() } else { format!("{value:.3e}") }
}

fn render_text(report: &Report, a_path: &Path, b_path: &Path) -> String {
    let mut out = format!("A: {}\nB: {}\n", a_path.display(), b_path.display());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for name in &report.only_in_a {
        rows.push(vec![
            printable(name).into_owned(),
            "only in A".into(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    for name in &report.only_in_b {
        rows.push(vec![
            printable(name).into_owned(),
            "only in B".into(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    for common in report.common.iter().filter(|common| common.layout_differs() || common.values_differ()) {
        let what = match (common.a.dtype != common.b.dtype, common.a.shape != common.b.shape, common.values_differ()) {
            (_, true, _) => "shape",
            (true, false, true) => "dtype, values",
            (true, false, false) => "dtype",
            (false, false, _) => "values",
        };
        let (max, differing) = match &common.compared {
            Some(compared) => {
                (number(compared.max_abs_diff), format!("{}/{}", compared.differing, elements(&common.a.shape)))
            }
            None => (String::new(), String::new()),
        };
        rows.push(vec![
            printable(&common.name).into_owned(),
            what.into(),
            layout(&common.a, common.a_stored),
            layout(&common.b, common.b_stored),
            max,
            differing,
        ]);
    }
    if !rows.is_empty() {
        let header = ["name", "difference", "A", "B", "max |a-b|", "differing"];
        out.push_str(&nnx::__private::render_columns(&header, &rows));
    }
    let blocks = report.common.iter().any(|common| {
        (common.a_stored.is_some() || common.b_stored.is_some()) && (common.layout_differs() || common.values_differ())
    });
    if blocks {
        out.push_str("ggml block types are compared as the floats they decode to\n");
    }
    let layouts = report.common.iter().filter(|common| common.layout_differs()).count();
    let values = report.common.iter().filter(|common| !common.layout_differs() && common.values_differ()).count();
    let same = report.common.len() - layouts - values;
    if report.equal() {
        out.push_str(&format!("equal: {} tensors\n", report.common.len()));
    } else {
        out.push_str(&format!(
            "different: {} only in A, {} only in B, {layouts} with another dtype or shape, {values} with other values, {same} of {} common tensors equal\n",
            report.only_in_a.len(),
            report.only_in_b.len(),
            report.common.len()
        ));
    }
    out
}

/// A JSON number, or `null` for an infinite or undefined difference.
fn json_number(value: f64) -> serde_json::Value {
    if value.is_finite() { serde_json::json!(value) } else { serde_json::Value::Null }
}

/// One side of a common tensor: the dtype it is compared as, its shape, and the ggml block type
/// it is stored as, when it is one.
fn side(info: &EntryInfo, stored: Option<&str>) -> serde_json::Value {
    let mut value = serde_json::json!({ "dtype": info.dtype.to_string(), "shape": info.shape });
    if let Some(ty) = stored {
        value["ggml_type"] = serde_json::json!(ty);
    }
    value
}

fn render_json(report: &Report, a_path: &Path, b_path: &Path, atol: f64) -> String {
    let common: Vec<serde_json::Value> = report
        .common
        .iter()
        .map(|common| {
            let mut value = serde_json::json!({
                "name": common.name,
                "a": side(&common.a, common.a_stored),
                "b": side(&common.b, common.b_stored),
                "dtype_differs": common.a.dtype != common.b.dtype,
                "shape_differs": common.a.shape != common.b.shape,
                "compared": common.compared.is_some(),
                "elements": elements(&common.a.shape),
            });
            if let Some(compared) = &common.compared {
                value["max_abs_diff"] = json_number(compared.max_abs_diff);
                value["differing"] = serde_json::json!(compared.differing);
            }
            value["equal"] = serde_json::json!(!common.layout_differs() && !common.values_differ());
            value
        })
        .collect();
    serde_json::json!({
        "a": a_path.to_string_lossy(),
        "b": b_path.to_string_lossy(),
        "atol": atol,
        "equal": report.equal(),
        "only_in_a": report.only_in_a,
        "only_in_b": report.only_in_b,
        "common": common,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::{Values, compare, float_distance, parse_tolerance};

    #[test]
    fn floats_treat_nan_as_equal_to_nan_only() {
        assert_eq!(float_distance(f64::NAN, f64::NAN), 0.0);
        assert_eq!(float_distance(f64::NAN, 1.0), f64::INFINITY);
        assert_eq!(float_distance(f64::INFINITY, f64::INFINITY), 0.0);
        assert_eq!(float_distance(f64::INFINITY, f64::NEG_INFINITY), f64::INFINITY);
        assert_eq!(float_distance(1.0, 1.5), 0.5);
    }

    #[test]
    fn integers_are_exact_and_ignore_the_tolerance() {
        let a = Values::Integer(vec![i64::MAX.into(), 0]);
        let b = Values::Integer(vec![i128::from(i64::MAX) - 1, 0]);
        let compared = compare(&a, &b, 10.0).unwrap();
        assert_eq!((compared.differing, compared.max_abs_diff), (1, 1.0));
    }

    #[test]
    fn tolerances() {
        assert_eq!(parse_tolerance("1e-3"), Ok(1e-3));
        assert!(parse_tolerance("-1").is_err());
        assert!(parse_tolerance("nan").is_err());
    }
}
