//! The GPU device: one wgpu adapter opened with its real limits, its queue, storage buffers, the
//! cache of compiled pipelines, and the moves of tensors between the host and the device.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::host_memory::{self, HostImport};
use crate::device::{Device, DeviceStorage, Placement};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::{DType, Tensor};

/// One wgpu adapter, opened with its real limits.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<Inner>,
    /// Whether placing a page-aligned mapped tensor imports its pages (see
    /// [`Gpu::with_zero_copy`]).
    zero_copy: bool,
}

struct Inner {
    index: usize,
    info: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    shader_f16: bool,
    host_import: HostImport,
    pipelines: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
}

/// The storage of a GPU tensor: a storage buffer, or none for a meta tensor.
#[doc(hidden)]
pub struct GpuStorage {
    pub(crate) buffer: Option<wgpu::Buffer>,
}

impl DeviceStorage for GpuStorage {
    fn is_meta(&self) -> bool {
        self.buffer.is_none()
    }
}

impl crate::device::sealed::Sealed for Gpu {}

impl Device for Gpu {
    type Storage = GpuStorage;

    fn name(&self) -> String {
        format!("gpu {} ({})", self.inner.index, self.inner.info.name)
    }

    fn transfer(&self, tensor: &Tensor) -> Result<(Tensor<Gpu>, Placement)> {
        if let Some(placed) = self.import_pages(tensor) {
            return Ok((placed, Placement::ZeroCopy));
        }
        Ok((tensor.to_device(self)?, Placement::Uploaded))
    }
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("index", &self.inner.index)
            .field("name", &self.inner.info.name)
            .field("backend", &self.inner.info.backend)
            .finish()
    }
}

impl PartialEq for Gpu {
    fn eq(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

fn describe(index: usize, info: &wgpu::AdapterInfo) -> String {
    format!("{index}: {} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

impl Gpu {
    /// The adapters wgpu finds, as `index: name (backend, type)`: the indices [`Gpu::open`]
    /// takes.
    pub fn adapters() -> Vec<String> {
        let adapters = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
        adapters.iter().enumerate().map(|(index, adapter)| describe(index, &adapter.get_info())).collect()
    }

    /// Opens adapter `index` (in the order of [`Gpu::adapters`]) with the adapter's own limits
    /// (storage bindings as large as it allows, not wgpu's 128 MiB default) and `shader-f16`
    /// where the adapter has it.
    ///
    /// # Errors
    /// [`Error::NoAdapter`] listing the adapters found; [`Error::Gpu`] when the device cannot
    /// be created.
    pub fn open(index: usize) -> Result<Gpu> {
        let mut adapters = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
        if index >= adapters.len() {
            let found = adapters.iter().enumerate().map(|(i, adapter)| describe(i, &adapter.get_info())).collect();
            return Err(Error::NoAdapter { index, found });
        }
        let adapter = adapters.swap_remove(index);
        let info = adapter.get_info();
        let limits = adapter.limits();
        let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let required_features = if shader_f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("nnx"),
            required_features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        #[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
        let opened = match info.backend {
            wgpu::Backend::Vulkan => host_memory::vulkan::open(&adapter, &descriptor),
            _ => None,
        };
        #[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
        let opened = None;
        let (device, queue, host_import) = match opened {
            Some(opened) => opened,
            None => {
                let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|error| {
                    Error::Gpu { device: describe(index, &info), action: "open", message: error.to_string() }
                })?;
                #[cfg(target_vendor = "apple")]
                let host_import = match info.backend {
                    wgpu::Backend::Metal => HostImport::Metal { alignment: host_memory::metal::page_size() },
                    _ => HostImport::Unavailable,
                };
                #[cfg(not(target_vendor = "apple"))]
                let host_import = HostImport::Unavailable;
                (device, queue, host_import)
            }
        };
        Ok(Gpu {
            inner: Arc::new(Inner {
                index,
                info,
                device,
                queue,
                limits,
                shader_f16,
                host_import,
                pipelines: Mutex::new(HashMap::new()),
            }),
            zero_copy: true,
        })
    }

    /// The adapter's name, backend and type.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.inner.info
    }

    /// The adapter as [`Gpu::adapters`] lists it: `index: name (backend, type)`.
    pub fn description(&self) -> String {
        describe(self.inner.index, &self.inner.info)
    }

    /// Whether the adapter computes on the CPU (a software driver such as Mesa's lavapipe or
    /// WARP): it runs, but far slower than nnx's own CPU kernels.
    pub fn is_software(&self) -> bool {
        self.inner.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The limits the device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.inner.limits
    }

    /// The alignment (in bytes, of address and size) at which this device can use a mapped
    /// file's pages as a buffer without copying them, or `None` when it cannot (placement then
    /// uploads). Vulkan adapters with `VK_EXT_external_memory_host` report their
    /// `minImportedHostPointerAlignment` (4 KiB on lavapipe), Metal its page size.
    pub fn zero_copy_alignment(&self) -> Option<u64> {
        if self.zero_copy { self.inner.host_import.alignment() } else { None }
    }

    /// This device with zero-copy placement on or off (it is on when the device supports it).
    /// With it off, every placed tensor is uploaded: for comparing the two, or for weights
    /// whose file may be rewritten in place while they are on the device.
    pub fn with_zero_copy(&self, enabled: bool) -> Gpu {
        Gpu { inner: Arc::clone(&self.inner), zero_copy: enabled }
    }

    /// `tensor` as a buffer over the pages of the file it is mapped from, when it is a
    /// contiguous view of a mapping that starts on the device's import alignment; `None`
    /// otherwise (or when the driver refuses the pages), and the caller uploads it.
    fn import_pages(&self, tensor: &Tensor) -> Option<Tensor<Gpu>> {
        let alignment = self.zero_copy_alignment()?;
        if !tensor.is_contiguous() || tensor.dtype().size_in_bytes().is_none() {
            return None;
        }
        let Storage::Shared { source, .. } = &tensor.storage().0 else { return None };
        if !source.is_file_mapping() {
            return None;
        }
        let std::borrow::Cow::Borrowed(bytes) = tensor.to_bytes().ok()? else { return None };
        let mapping = source.bytes();
        let start = bytes.as_ptr() as usize;
        let span = self.inner.host_import.span(start, bytes.len(), mapping.as_ptr() as usize + mapping.len())?;
        debug_assert!(start.is_multiple_of(alignment as usize));
        let keep = Arc::clone(source);
        let buffer = match self.inner.host_import {
            // SAFETY: the span starts on the import alignment and ends inside the mapping's
            // pages (`HostImport::span`); `keep` holds the mapping, whose bytes never change
            // (the `ByteSource` contract), for as long as the buffer lives.
            #[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
            HostImport::Vulkan { .. } => unsafe {
                host_memory::vulkan::import(self.device(), bytes.as_ptr(), span, keep)
            },
            // SAFETY: as above, with page alignment.
            #[cfg(target_vendor = "apple")]
            HostImport::Metal { .. } => unsafe {
                host_memory::metal::import(self.device(), bytes.as_ptr(), span, keep)
            },
            _ => {
                drop((keep, span));
                None
            }
        }?;
        Some(self.tensor(Some(buffer), tensor.dtype(), tensor.shape()))
    }

    /// Whether shaders may use `f16`.
    pub fn has_shader_f16(&self) -> bool {
        self.inner.shader_f16
    }

    pub(crate) fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    pub(crate) fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    pub(crate) fn fail(&self, action: &'static str, message: impl fmt::Display) -> Error {
        Error::Gpu { device: self.name(), action, message: message.to_string() }
    }

    /// A storage buffer of `bytes` (rounded up to 4, as bindings require).
    pub(crate) fn buffer(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        let size = bytes.div_ceil(4).max(1) * 4;
        if size > self.inner.limits.max_buffer_size {
            return Err(self.fail(
                "allocate a buffer",
                format!(
                    "{size} bytes exceed the adapter's largest buffer ({} bytes)",
                    self.inner.limits.max_buffer_size
                ),
            ));
        }
        let scope = self.inner.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.inner.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(self.fail("allocate a buffer", error));
        }
        Ok(buffer)
    }

    /// The compute pipeline of `entry` in `source`, compiled once per device.
    ///
    /// # Errors
    /// [`Error::Gpu`] with the compiler's message when the shader does not validate (instead of
    /// wgpu's panic).
    pub(crate) fn pipeline(&self, key: &'static str, source: &str, entry: &str) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut pipelines = self.inner.pipelines.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(pipeline) = pipelines.get(key) {
            return Ok(Arc::clone(pipeline));
        }
        let scope = self.inner.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.inner.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = Arc::new(self.inner.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        }));
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(self.fail("compile a kernel", error));
        }
        pipelines.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// Waits until the queue is idle.
    pub(crate) fn wait(&self) -> Result<()> {
        self.inner
            .device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map(|_| ())
            .map_err(|error| self.fail("finish its work", error))
    }

    /// A contiguous tensor on this device over `buffer`.
    pub(crate) fn tensor(&self, buffer: Option<wgpu::Buffer>, dtype: DType, shape: &[usize]) -> Tensor<Gpu> {
        Tensor::from_parts(std::sync::Arc::new(GpuStorage { buffer }), dtype, shape, self.clone())
    }
}

impl Tensor {
    /// A copy of this tensor on `gpu` (contiguous, in the same dtype). A meta tensor gives a
    /// meta tensor on the device, which allocates nothing.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the device cannot hold it.
    pub fn to_device(&self, gpu: &Gpu) -> Result<Tensor<Gpu>> {
        if self.is_meta() {
            return Ok(gpu.tensor(None, self.dtype(), self.shape()));
        }
        let bytes = self.to_bytes()?;
        let buffer = gpu.buffer(bytes.len() as u64, "tensor")?;
        if !bytes.is_empty() {
            // `write_buffer` needs a multiple of 4 bytes; the tail is padded with zeros.
            let whole = bytes.len() / 4 * 4;
            if whole > 0 {
                gpu.queue().write_buffer(&buffer, 0, &bytes[..whole]);
            }
            if whole < bytes.len() {
                let mut tail = [0u8; 4];
                tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
                gpu.queue().write_buffer(&buffer, whole as u64, &tail);
            }
        }
        Ok(gpu.tensor(Some(buffer), self.dtype(), self.shape()))
    }
}

impl Tensor<Gpu> {
    /// A meta tensor on `gpu`: a dtype and a shape, no buffer.
    pub fn meta_on(gpu: &Gpu, dtype: DType, shape: &[usize]) -> Tensor<Gpu> {
        gpu.tensor(None, dtype, shape)
    }

    /// A host copy of this tensor's elements (row-major). A meta tensor gives a meta tensor.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the transfer fails.
    pub fn to_host(&self) -> Result<Tensor> {
        let gpu = self.device();
        let contiguous = self.contiguous()?;
        let Some(buffer) = contiguous.buffer() else {
            return Ok(Tensor::meta(self.dtype(), self.shape()));
        };
        let bytes = self.byte_len() as u64;
        let start = (contiguous.offset() * self.dtype().size_in_bytes().unwrap_or(1)) as u64;
        let size = bytes.div_ceil(4).max(1) * 4;
        let staging = gpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("to_host"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder =
            gpu.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("to_host") });
        // Copies need 4-byte offsets and sizes: copy the aligned span that covers the bytes.
        let aligned_start = start / 4 * 4;
        let skip = (start - aligned_start) as usize;
        let span = (skip as u64 + bytes).div_ceil(4) * 4;
        let span = span.min(buffer.size() - aligned_start);
        let staging = if skip == 0 {
            staging
        } else {
            gpu.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("to_host"),
                size: span.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        if span > 0 {
            encoder.copy_buffer_to_buffer(buffer, aligned_start, &staging, 0, span);
        }
        gpu.queue().submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (sender, receiver) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |result| {
            let _ = sender.send(result);
        });
        gpu.wait()?;
        receiver
            .recv()
            .map_err(|error| gpu.fail("read a buffer back", error))?
            .map_err(|error| gpu.fail("read a buffer back", error))?;
        let data = slice.get_mapped_range().map_err(|error| gpu.fail("read a buffer back", error))?;
        let host = Tensor::from_bytes(self.dtype(), self.shape(), &data[skip..skip + bytes as usize]);
        drop(data);
        staging.unmap();
        host
    }

    /// The buffer, or `None` for a meta tensor.
    pub(crate) fn buffer(&self) -> Option<&wgpu::Buffer> {
        self.storage().buffer.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::gpu::test_gpu;

    #[test]
    fn tensors_round_trip_through_the_device() {
        let Some(gpu) = test_gpu() else { return };
        let f32s = Tensor::from_vec((0..37).map(|v| v as f32 * 0.5 - 3.0).collect::<Vec<_>>(), &[37]).unwrap();
        let cases = [
            f32s.clone(),
            f32s.to_dtype(DType::F16).unwrap(),
            f32s.to_dtype(DType::BF16).unwrap(),
            f32s.to_dtype(DType::F64).unwrap(),
            Tensor::from_vec((0..37u8).collect::<Vec<_>>(), &[37]).unwrap(),
            Tensor::from_vec((0..37i64).map(|v| v - 18).collect::<Vec<_>>(), &[37]).unwrap(),
            Tensor::from_vec(vec![true, false, true], &[3]).unwrap(),
            Tensor::from_vec(Vec::<f32>::new(), &[0, 4]).unwrap(),
        ];
        for host in cases {
            let back = host.to_device(&gpu).unwrap().to_host().unwrap();
            assert_eq!((back.dtype(), back.shape()), (host.dtype(), host.shape()));
            assert_eq!(back.to_bytes().unwrap(), host.to_bytes().unwrap(), "{:?}", host.dtype());
        }
        let meta = Tensor::meta(DType::BF16, &[1 << 20, 1 << 20]).to_device(&gpu).unwrap();
        assert!(meta.is_meta() && meta.to_host().unwrap().is_meta());
    }

    #[test]
    fn strided_views_are_gathered_on_the_device() {
        let Some(gpu) = test_gpu() else { return };
        let values: Vec<f32> = (0..2 * 3 * 5).map(|v| v as f32).collect();
        let host = Tensor::from_vec(values, &[2, 3, 5]).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::U8, DType::I64] {
            let host = if dtype == DType::U8 || dtype == DType::I64 {
                let ints: Vec<u8> = (0..30u8).collect();
                let t = Tensor::from_vec(ints, &[2, 3, 5]).unwrap();
                if dtype == DType::U8 {
                    t
                } else {
                    Tensor::from_vec((0..30i64).collect::<Vec<_>>(), &[2, 3, 5]).unwrap()
                }
            } else {
                host.to_dtype(dtype).unwrap()
            };
            let device = host.to_device(&gpu).unwrap();
            let views = [
                (host.permute(&[2, 0, 1]).unwrap(), device.permute(&[2, 0, 1]).unwrap()),
                (host.narrow(2, 1, 3).unwrap(), device.narrow(2, 1, 3).unwrap()),
                (
                    host.transpose(0, 1).unwrap().narrow(0, 1, 2).unwrap(),
                    device.transpose(0, 1).unwrap().narrow(0, 1, 2).unwrap(),
                ),
            ];
            for (expected, view) in views {
                let back = view.contiguous().unwrap().to_host().unwrap();
                assert_eq!(
                    back.to_bytes().unwrap(),
                    expected.contiguous().to_bytes().unwrap(),
                    "{dtype:?} {:?}",
                    expected.shape()
                );
            }
        }
        let _ = (f16::ONE, bf16::ONE);
    }

    #[test]
    fn a_missing_adapter_lists_the_ones_found() {
        let error = Gpu::open(999).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("no GPU adapter 999: found "), "{message}");
        assert!(matches!(error, Error::NoAdapter { ref found, .. } if found.len() == Gpu::adapters().len()));
    }
}
