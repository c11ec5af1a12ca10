//! Devices: where a tensor's elements live. [`Host`] is the CPU; `Gpu` (the `gpu` feature) is
//! one wgpu adapter. The device is a type parameter of [`crate::Tensor`], so an operation that
//! mixes devices does not compile.

use std::fmt;

use crate::Tensor;
use crate::error::Result;
use crate::storage::Storage;

/// Only nnx's devices implement [`Device`]: each device module implements this for its type.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Where a tensor's elements live: [`Host`], or `Gpu` with the `gpu` feature.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a device",
    label = "tensors live on `nnx::Host` or `nnx::Gpu`",
    note = "move a tensor between devices with `to_device(&gpu)` and `to_host()`"
)]
pub trait Device: Clone + fmt::Debug + Send + Sync + 'static + sealed::Sealed {
    /// What holds a tensor's elements on this device.
    #[doc(hidden)]
    type Storage: DeviceStorage;

    /// A short name for errors and reports (`host`, `gpu 0 (llvmpipe)`).
    fn name(&self) -> String;

    /// `tensor` moved onto this device (a meta tensor stays meta): what [`crate::Place`] calls
    /// for each leaf. Page-aligned entries of a mapped file are placed over the file's own
    /// pages where the device can do that; see [`Device::transfer`].
    ///
    /// # Errors
    /// The device's error when it cannot hold the tensor.
    fn upload(&self, tensor: &Tensor) -> Result<Tensor<Self>> {
        Ok(self.transfer(tensor)?.0)
    }

    /// `tensor` on this device, and how it got there: shared on the host, placed over the
    /// pages of its mapped file without a copy, or uploaded.
    ///
    /// # Errors
    /// The device's error when it cannot hold the tensor.
    fn transfer(&self, tensor: &Tensor) -> Result<(Tensor<Self>, Placement)>;
}

/// How a host tensor reached its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Still on the host: the same storage, shared.
    Shared,
    /// A device buffer over the pages of the file the tensor was mapped from: nothing copied,
    /// nothing allocated, and the buffer keeps the mapping alive.
    ZeroCopy,
    /// Copied into device memory (straight from the mapped pages when the tensor was mapped).
    Uploaded,
}

/// What every device's storage answers.
#[doc(hidden)]
pub trait DeviceStorage: Send + Sync + 'static {
    /// Whether there are no elements at all (a meta tensor).
    fn is_meta(&self) -> bool;
}

/// The CPU: tensors in host memory, owned or mapped from files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Host;

impl sealed::Sealed for Host {}

impl Device for Host {
    type Storage = HostStorage;

    fn name(&self) -> String {
        "host".to_string()
    }

    fn transfer(&self, tensor: &Tensor) -> Result<(Tensor, Placement)> {
        Ok((tensor.clone(), Placement::Shared))
    }
}

/// The storage of a host tensor: opaque, so that only nnx builds one (its invariants are what
/// makes typed reads sound).
#[doc(hidden)]
pub struct HostStorage(pub(crate) Storage);

impl DeviceStorage for HostStorage {
    fn is_meta(&self) -> bool {
        matches!(self.0, Storage::Meta)
    }
}

/// A tensor on the device `D`: what an operation on a `Tensor<D>` takes as its other operands,
/// so that mixing devices is refused when the program compiles, with a message that says how to
/// move the tensor.
#[diagnostic::on_unimplemented(
    message = "this operation needs a tensor on `{D}`, but `{Self}` lives on another device",
    label = "on another device",
    note = "tensors move only when asked: `tensor.to_device(&gpu)?` puts a host tensor on the GPU, `tensor.to_host()?` brings a GPU tensor back"
)]
pub trait OnDevice<D: Device> {
    /// The tensor itself.
    fn on_device(&self) -> &Tensor<D>;
}

impl<D: Device> OnDevice<D> for Tensor<D> {
    fn on_device(&self) -> &Tensor<D> {
        self
    }
}
