//! The GPU device on wgpu: one adapter (Metal on Apple, Vulkan on Linux and Android, DX12 on
//! Windows), its buffers, and the WGSL kernels that compute on them.
//!
//! A [`Gpu`] is a cheap handle (cloning shares the device). Tensors move with
//! [`Tensor::to_device`](crate::Tensor::to_device) and
//! [`Tensor::to_host`](crate::Tensor::to_host); nothing moves implicitly.
//!
//! `device.rs` holds the device (adapter, queue, buffers, compiled pipelines), `host_memory.rs`
//! zero-copy placement and `dispatch.rs` one dispatch of a kernel; `launch/` the kernels'
//! launchers, one file per op family, each with the parameter blocks its shaders read; `wgsl/`
//! the shaders. Operands are checked by `crate::shape`, as on the host.

mod device;
mod dispatch;
mod host_memory;
#[cfg(test)]
mod kernel_tests;
mod launch;
mod layout;

pub use device::{Gpu, GpuStorage};
pub(crate) use launch::{attention, attention_windowed, embedding};

/// The GPU the tests run on: adapter `NNX_GPU` (default 0). Without one, `None` after saying
/// why, except under CI (`CI` set), where a missing adapter fails the run.
#[doc(hidden)]
pub fn test_gpu() -> Option<Gpu> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    match Gpu::open(index) {
        Ok(gpu) => Some(gpu),
        Err(error) if std::env::var_os("CI").is_some() => {
            panic!("CI needs a GPU adapter (Mesa's lavapipe: `mesa-vulkan-drivers libvulkan1`): {error}")
        }
        Err(error) => {
            eprintln!("skipping a GPU test: {error}");
            None
        }
    }
}
