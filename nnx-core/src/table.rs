//! Rendering a module's keys as a text table: name, dtype, shape and the import rule each
//! tensor carries. Used by examples, snapshots and error reports.

use std::fmt::Write;

use crate::module::{ImportOp, Module, TensorSlot, for_each_entry};

/// The import rule of one tensor in words: `<- source ops`, `tie path`, `optional`, `dtype`.
/// Empty when the tensor is read from its own name as it is. `rank` is the tensor's rank:
/// transposes apply to rank-2+ tensors only and are not shown for the others.
pub fn describe_import(entry: &TensorSlot<'_>, rank: usize) -> String {
    let mut parts = Vec::new();
    if let Some(tie) = entry.tie {
        parts.push(format!("tie {tie}"));
    } else if entry.source != entry.name || !entry.ops.is_empty() {
        let mut source = format!("<- {}", entry.source);
        for op in entry.ops {
            match op {
                ImportOp::Split(split) => {
                    let _ = write!(source, " split({}, {}/{})", split.axis, split.index + 1, split.parts);
                }
                ImportOp::Transpose if rank >= 2 => source.push_str(" transpose"),
                ImportOp::Transpose => {}
                ImportOp::RopePermute(key) => {
                    let _ = write!(source, " rope_permute({key})");
                }
                ImportOp::Offset(value) => {
                    let _ = write!(source, " offset({value})");
                }
            }
        }
        parts.push(source);
    }
    if entry.optional {
        parts.push("optional".into());
    }
    if let Some(dtype) = entry.dtype {
        parts.push(format!("dtype {dtype}"));
    }
    parts.join(", ")
}

/// Renders rows as aligned columns separated by two spaces, without trailing spaces.
pub fn render_columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|cell| cell.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        // Padded by hand: `format!`'s width is at most `u16::MAX`, and a name from a file is not.
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell}{}", " ".repeat(width.saturating_sub(cell.chars().count()))))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A table of every tensor of `module` in walk order: name, dtype, shape, and the recorded
/// import rule (the import column appears only when some tensor has one).
///
/// # Examples
/// ```
/// use nnx_core::{key_table, nn::{Init, Linear}};
/// let table = key_table(&Linear::builder(4, 2).init(Init::Meta).build());
/// assert_eq!(table, "name    dtype  shape\nweight  F32    [2, 4]\nbias    F32    [2]\n");
/// ```
pub fn key_table<M: Module + ?Sized>(module: &M) -> String {
    let mut rows = Vec::new();
    for_each_entry(module, |entry, tensor| {
        rows.push(vec![
            entry.name.to_string(),
            tensor.dtype().to_string(),
            format!("{:?}", tensor.shape()),
            describe_import(&entry, tensor.rank()),
        ]);
    });
    if rows.iter().all(|row| row[3].is_empty()) {
        for row in &mut rows {
            row.pop();
        }
        return render_columns(&["name", "dtype", "shape"], &rows);
    }
    render_columns(&["name", "dtype", "shape", "import"], &rows)
}
