//! DLPack capsules of nnx's tensors (the layout of `dlpack.h`, versions 0.8 and 1.x), so that
//! `torch.from_dlpack`, `jax.dlpack` and `numpy.from_dlpack` take a tensor's memory without a
//! copy. The capsule owns a reference to the tensor's bytes until the consumer's deleter runs.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use nnx::DType;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use crate::Payload;

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`, before DLPack 1.0.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned`, DLPack 1.0 and later: with flags, read-only among them.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

const READ_ONLY: u64 = 1;
const IS_COPIED: u64 = 2;
const CPU: i32 = 1;

/// What the capsule keeps alive: the bytes and the shape and strides it points to.
struct Context {
    _payload: Arc<Payload>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// DLPack's type code and bits of `dtype`; `None` for types DLPack consumers do not read.
fn data_type(dtype: DType) -> Option<DlDataType> {
    let (code, bits) = match dtype {
        DType::I8 => (0, 8),
        DType::I16 => (0, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::U16 => (1, 16),
        DType::U32 => (1, 32),
        DType::F16 => (2, 16),
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::BF16 => (4, 16),
        DType::C64 => (5, 64),
        DType::Bool => (6, 8),
        _ => return None,
    };
    Some(DlDataType { code, bits, lanes: 1 })
}

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

unsafe extern "C" fn delete_legacy(managed: *mut DlManagedTensor) {
    // SAFETY: `managed` and its context were made by `Box::into_raw` in `capsule`, and DLPack's
    // contract is that the deleter runs once.
    unsafe {
        drop(Box::from_raw((*managed).manager_ctx.cast::<Context>()));
        drop(Box::from_raw(managed));
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DlManagedTensorVersioned) {
    // SAFETY: as `delete_legacy`.
    unsafe {
        drop(Box::from_raw((*managed).manager_ctx.cast::<Context>()));
        drop(Box::from_raw(managed));
    }
}

/// The capsule's destructor: a capsule no consumer took (still named `dltensor` or
/// `dltensor_versioned`) frees its tensor; a consumer renames the capsule it takes and calls the
/// deleter itself.
unsafe extern "C" fn destroy_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: `capsule` is a capsule (this is its destructor); `PyCapsule_IsValid` checks the
    // name without raising, and a valid capsule holds the pointer `capsule` stored.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast::<DlManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        } else if pyo3::ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let managed =
                pyo3::ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr()).cast::<DlManagedTensorVersioned>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// A DLPack capsule of `payload`: versioned (flagged read-only for a mapped file's bytes) when
/// the consumer reads DLPack 1.0, else the older form, which has no read-only flag, so a mapped
/// file's bytes are copied for it, as they are when `copy` asks.
pub(crate) fn capsule(py: Python<'_>, payload: &Arc<Payload>, versioned: bool, copy: bool) -> PyResult<Py<PyAny>> {
    let dtype = data_type(payload.dtype)
        .ok_or_else(|| PyBufferError::new_err(format!("DLPack has no type for {} values", payload.dtype)))?;
    let copied = copy || (payload.read_only && !versioned);
    let payload = if copied {
        let tensor = payload.copied().map_err(|error| PyBufferError::new_err(error.to_string()))?;
        Arc::new(Payload::new(tensor, payload.shape.clone()).map_err(|e| PyBufferError::new_err(e.to_string()))?)
    } else {
        payload.clone()
    };
    let shape: Vec<i64> = payload.shape.iter().map(|&n| n as i64).collect();
    let strides = match &payload.strides {
        Some(strides) => strides.iter().map(|&stride| stride as i64).collect(),
        None => {
            let mut strides = vec![1i64; shape.len()];
            for axis in (0..shape.len().saturating_sub(1)).rev() {
                strides[axis] = strides[axis + 1] * shape[axis + 1];
            }
            strides
        }
    };
    let (data, read_only) = (payload.ptr as *mut c_void, payload.read_only);
    let mut context = Box::new(Context { _payload: payload, shape, strides });
    let tensor = DlTensor {
        data,
        device: DlDevice { device_type: CPU, device_id: 0 },
        ndim: context.shape.len() as i32,
        dtype,
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let context = Box::into_raw(context).cast::<c_void>();
    // SAFETY: the capsule owns `managed` (freed by `destroy_capsule` unless a consumer takes
    // it, which then calls the deleter); `PyCapsule_New` returns a new reference or null with
    // an exception set, which `from_owned_ptr_or_err` turns into the error.
    unsafe {
        let raw = if versioned {
            let flags = if read_only { READ_ONLY } else { 0 } | if copied { IS_COPIED } else { 0 };
            let managed = Box::into_raw(Box::new(DlManagedTensorVersioned {
                version: DlPackVersion { major: 1, minor: 0 },
                manager_ctx: context,
                deleter: Some(delete_versioned),
                flags,
                dl_tensor: tensor,
            }));
            pyo3::ffi::PyCapsule_New(managed.cast(), VERSIONED_NAME.as_ptr(), Some(destroy_capsule))
        } else {
            let managed = Box::into_raw(Box::new(DlManagedTensor {
                dl_tensor: tensor,
                manager_ctx: context,
                deleter: Some(delete_legacy),
            }));
            pyo3::ffi::PyCapsule_New(managed.cast(), LEGACY_NAME.as_ptr(), Some(destroy_capsule))
        };
        Bound::from_owned_ptr_or_err(py, raw).map(Bound::unbind)
    }
}
