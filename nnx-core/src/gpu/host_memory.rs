//! Zero-copy placement: a GPU buffer over pages the host already has (a mapped checkpoint), so
//! placing a page-aligned entry copies nothing and allocates nothing.
//!
//! - Vulkan: the pages are imported as device memory with `VK_EXT_external_memory_host`
//!   (lavapipe, NVIDIA, AMD and Intel drivers have it), then wrapped as a wgpu buffer through
//!   wgpu's HAL. The device is opened with the extension enabled when the adapter offers it.
//! - Metal: `newBufferWithBytesNoCopy` over the pages, wrapped the same way.
//!
//! Each buffer owns a handle on what keeps the pages mapped and releases it only when the
//! device has dropped the buffer, so a mapping never goes away under a kernel. The buffers are
//! only ever read: nnx binds weights as kernel inputs, and the pages may be mapped read-only.

use std::sync::Arc;

use crate::storage::ByteSource;

/// What keeps imported pages alive: the mapping behind a tensor's storage.
pub(crate) type Keep = Arc<dyn ByteSource>;

/// How the device imports host pages, decided when it is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostImport {
    /// Not available: placement uploads.
    Unavailable,
    /// Vulkan with `VK_EXT_external_memory_host`; pointers and sizes aligned to `alignment`.
    #[cfg_attr(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")), allow(dead_code))]
    Vulkan { alignment: u64 },
    /// Metal's no-copy buffers; pointers and sizes aligned to the VM page size.
    #[cfg_attr(not(target_vendor = "apple"), allow(dead_code))]
    Metal { alignment: u64 },
}

impl HostImport {
    /// The alignment an imported pointer and size need, or `None` when nothing can be imported.
    pub(crate) fn alignment(self) -> Option<u64> {
        match self {
            HostImport::Unavailable => None,
            HostImport::Vulkan { alignment } | HostImport::Metal { alignment } => Some(alignment),
        }
    }

    /// The span to import for `len` bytes at `start` of a mapping whose bytes end at `end`
    /// (addresses): `start` must sit on the alignment, and the span is `len` rounded up to it,
    /// which must stay inside the mapping's pages (a mapping covers whole 4 KiB pages at least,
    /// so rounding up to an alignment of at most 4 KiB always does).
    pub(crate) fn span(self, start: usize, len: usize, end: usize) -> Option<u64> {
        let alignment = self.alignment()?;
        let (start, len, end) = (start as u64, len as u64, end as u64);
        if len == 0 || !start.is_multiple_of(alignment) {
            return None;
        }
        let span = len.div_ceil(alignment) * alignment;
        let mapped_end = end.div_ceil(4096) * 4096;
        (start + span <= mapped_end).then_some(span)
    }
}

/// The descriptor of an imported buffer of `span` bytes: read by kernels and copied from, never
/// written.
#[cfg_attr(
    not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd", target_vendor = "apple")),
    allow(dead_code)
)]
fn descriptor(span: u64) -> wgpu::BufferDescriptor<'static> {
    wgpu::BufferDescriptor {
        label: Some("zero-copy"),
        size: span,
        usage: wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC),
        mapped_at_creation: false,
    }
}

#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) mod vulkan {
    //! `VK_EXT_external_memory_host` through wgpu's Vulkan HAL.

    use std::ffi::c_void;

    use ash::{ext, vk};
    use wgpu::hal::api::Vulkan;

    use super::{HostImport, Keep};

    const HOST: vk::ExternalMemoryHandleTypeFlags = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

    /// Opens `adapter` with `VK_EXT_external_memory_host` enabled, when it is a Vulkan 1.1
    /// adapter that offers the extension; `None` otherwise (the caller opens it plainly).
    pub(crate) fn open(
        adapter: &wgpu::Adapter,
        descriptor: &wgpu::DeviceDescriptor<'_>,
    ) -> Option<(wgpu::Device, wgpu::Queue, HostImport)> {
        let opened = {
            // SAFETY: the HAL adapter is only read here, and the device opened from it is
            // handed straight back to wgpu below.
            let hal = unsafe { adapter.as_hal::<Vulkan>() }?;
            let capabilities = hal.physical_device_capabilities();
            if capabilities.properties().api_version < vk::API_VERSION_1_1
                || hal.shared_instance().instance_api_version() < vk::API_VERSION_1_1
                || !capabilities.supports_extension(ext::external_memory_host::NAME)
            {
                return None;
            }
            let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
            let mut properties = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
            // SAFETY: the physical device belongs to this instance, which is Vulkan 1.1 or
            // later (checked above), and the chain holds one structure the extension defines.
            unsafe {
                hal.shared_instance()
                    .raw_instance()
                    .get_physical_device_properties2(hal.raw_physical_device(), &mut properties)
            };
            let alignment = host.min_imported_host_pointer_alignment.max(4);
            // SAFETY: the features and limits are what wgpu would open the adapter with, and
            // the callback only adds an extension the adapter offers.
            let device = unsafe {
                hal.open_with_callback(
                    descriptor.required_features,
                    &descriptor.required_limits,
                    &descriptor.memory_hints,
                    Some(Box::new(|arguments: wgpu::hal::vulkan::CreateDeviceCallbackArgs<'_, '_, '_>| {
                        arguments.extensions.push(ext::external_memory_host::NAME);
                    })),
                )
            }
            .ok()?;
            (device, alignment)
        };
        let (device, alignment) = opened;
        // SAFETY: the HAL device was opened from this adapter with the descriptor's features.
        let (device, queue) = unsafe { adapter.create_device_from_hal(device, descriptor) }.ok()?;
        Some((device, queue, HostImport::Vulkan { alignment }))
    }

    /// A buffer of `span` bytes over the host pages at `pointer`, which `keep` keeps mapped;
    /// `None` when the driver refuses these pages (the caller uploads instead).
    ///
    /// # Safety
    /// `pointer..pointer + span` must be mapped, readable and unchanged for as long as `keep`
    /// lives, and aligned as [`HostImport::span`] checks.
    pub(crate) unsafe fn import(
        device: &wgpu::Device,
        pointer: *const u8,
        span: u64,
        keep: Keep,
    ) -> Option<wgpu::Buffer> {
        let hal_buffer = {
            // SAFETY: the HAL device is used to create and bind objects it will own through
            // the buffer below; nothing it tracks is destroyed here.
            let hal = unsafe { device.as_hal::<Vulkan>() }?;
            let raw = hal.raw_device().clone();
            let instance = hal.shared_instance().raw_instance();
            let loader = ext::external_memory_host::Device::new(instance, &raw);
            let mut pointer_properties = vk::MemoryHostPointerPropertiesEXT::default();
            // SAFETY: the extension is enabled on this device (`open`), and the pointer is
            // aligned host memory (the caller's contract).
            unsafe {
                (loader.fp().get_memory_host_pointer_properties_ext)(
                    loader.device(),
                    HOST,
                    pointer.cast::<c_void>(),
                    &mut pointer_properties,
                )
            }
            .result()
            .ok()?;
            let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HOST);
            let info = vk::BufferCreateInfo::default()
                .size(span)
                .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC)
                .sharing_mode(vk::SharingMode::EXCLUSIVE)
                .push_next(&mut external);
            // SAFETY: a valid create info on a live device.
            let buffer = unsafe { raw.create_buffer(&info, None) }.ok()?;
            // SAFETY: `buffer` was just created on `raw`.
            let requirements = unsafe { raw.get_buffer_memory_requirements(buffer) };
            // SAFETY: the physical device is the device's own.
            let memory_properties =
                unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
            let allowed = requirements.memory_type_bits & pointer_properties.memory_type_bits;
            let types = &memory_properties.memory_types[..memory_properties.memory_type_count as usize];
            let Some(memory_type) = (0..types.len()).find(|&at| allowed & (1 << at) != 0) else {
                // SAFETY: the buffer is unused and unbound.
                unsafe { raw.destroy_buffer(buffer, None) };
                return None;
            };
            if requirements.size > span {
                // SAFETY: as above.
                unsafe { raw.destroy_buffer(buffer, None) };
                return None;
            }
            let mut import =
                vk::ImportMemoryHostPointerInfoEXT::default().handle_type(HOST).host_pointer(pointer.cast_mut().cast());
            let allocate = vk::MemoryAllocateInfo::default()
                .allocation_size(span)
                .memory_type_index(memory_type as u32)
                .push_next(&mut import);
            // SAFETY: the pointer and size are aligned to `minImportedHostPointerAlignment`
            // and the memory type is one the driver reported for this pointer.
            let memory = match unsafe { raw.allocate_memory(&allocate, None) } {
                Ok(memory) => memory,
                Err(_) => {
                    // SAFETY: as above.
                    unsafe { raw.destroy_buffer(buffer, None) };
                    return None;
                }
            };
            // SAFETY: the memory is as large as the buffer requires and of an allowed type.
            if unsafe { raw.bind_buffer_memory(buffer, memory, 0) }.is_err() {
                // SAFETY: neither object is in use.
                unsafe {
                    raw.destroy_buffer(buffer, None);
                    raw.free_memory(memory, None);
                }
                return None;
            }
            let release = Box::new(move || {
                // SAFETY: wgpu runs this once, when the device no longer uses the buffer; the
                // pages stay mapped until both objects are gone.
                unsafe {
                    raw.destroy_buffer(buffer, None);
                    raw.free_memory(memory, None);
                }
                drop(keep);
            });
            // SAFETY: nnx destroys the buffer and memory in `release`, which wgpu calls when
            // it drops the buffer; the buffer is never mapped by wgpu.
            unsafe { wgpu::hal::vulkan::Buffer::from_raw_externally_owned(buffer, release) }
        };
        let descriptor = super::descriptor(span);
        // SAFETY: the buffer was created on this device with usages covering the descriptor's,
        // its memory is bound and holds the file's bytes (initialized), and its size is not 0.
        Some(unsafe { device.create_buffer_from_hal::<Vulkan>(hal_buffer, &descriptor) })
    }
}

#[cfg(target_vendor = "apple")]
pub(crate) mod metal {
    //! Metal's `newBufferWithBytesNoCopy` through wgpu's Metal HAL.

    use std::ffi::c_void;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    use block2::RcBlock;
    use objc2_metal::{MTLDevice, MTLResourceOptions};
    use wgpu::hal::api::Metal;

    use super::Keep;

    /// The VM page size no-copy buffers are aligned to (16 KiB on Apple silicon).
    pub(crate) fn page_size() -> u64 {
        // SAFETY: `getpagesize` has no preconditions.
        let size = unsafe { libc_getpagesize() };
        u64::try_from(size).unwrap_or(16384).max(4096)
    }

    unsafe extern "C" {
        #[link_name = "getpagesize"]
        fn libc_getpagesize() -> i32;
    }

    /// A shared-storage buffer of `span` bytes over the pages at `pointer`, which `keep`
    /// keeps mapped until Metal releases the buffer.
    ///
    /// # Safety
    /// `pointer..pointer + span` must be mapped, readable and unchanged for as long as `keep`
    /// lives, page-aligned in address and size.
    pub(crate) unsafe fn import(
        device: &wgpu::Device,
        pointer: *const u8,
        span: u64,
        keep: Keep,
    ) -> Option<wgpu::Buffer> {
        let hal_buffer = {
            // SAFETY: the HAL device is only used to create a buffer wgpu then owns.
            let hal = unsafe { device.as_hal::<Metal>() }?;
            let pointer = NonNull::new(pointer.cast_mut().cast::<c_void>())?;
            // Metal calls the deallocator once, when it releases the buffer; the mapping is
            // released with it.
            let keep = Mutex::new(Some(keep));
            let release = RcBlock::new(move |_: NonNull<c_void>, _: usize| {
                drop(keep.lock().ok().and_then(|mut keep| keep.take()));
            });
            // SAFETY: the pointer and length are page-aligned (the caller's contract) and the
            // pages outlive the buffer through the deallocator.
            let raw = unsafe {
                hal.raw_device().newBufferWithBytesNoCopy_length_options_deallocator(
                    pointer,
                    span as usize,
                    MTLResourceOptions::StorageModeShared,
                    Some(&release),
                )
            }?;
            // SAFETY: the buffer was made by this device and is `span` bytes long.
            unsafe { wgpu::hal::metal::Device::buffer_from_raw(raw, span) }
        };
        let descriptor = super::descriptor(span);
        // SAFETY: the buffer belongs to this device, holds the file's bytes and is not empty.
        Some(unsafe { device.create_buffer_from_hal::<Metal>(hal_buffer, &descriptor) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_need_an_aligned_start_and_stay_inside_the_mapping() {
        let import = HostImport::Vulkan { alignment: 4096 };
        assert_eq!(import.span(8192, 4096, 20000), Some(4096));
        assert_eq!(import.span(8192, 100, 20000), Some(4096));
        assert_eq!(import.span(8192, 4097, 20000), Some(8192));
        assert_eq!(import.span(8193, 100, 20000), None);
        assert_eq!(import.span(8192, 0, 20000), None);
        // The last page of a mapping is mapped whole even where the file ends inside it.
        assert_eq!(import.span(16384, 100, 16484), Some(4096));
        let metal = HostImport::Metal { alignment: 16384 };
        assert_eq!(metal.span(16384, 16384, 32768), Some(16384));
        assert_eq!(metal.span(16384, 100, 16484), None);
        assert_eq!(HostImport::Unavailable.span(0, 4096, 4096), None);
    }
}
