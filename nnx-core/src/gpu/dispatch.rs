//! Running a kernel: a uniform block of parameters, storage bindings, and a grid of 256-wide
//! workgroups folded into two dimensions (at most 65,535 workgroups per dimension).

use super::Gpu;
use crate::error::Result;

/// Invocations per workgroup of every kernel.
pub(crate) const WORKGROUP: u32 = 256;

/// The most workgroups along one dimension of a dispatch.
const MAX_GROUPS: u32 = 65_535;

/// One storage binding: a whole buffer, or a byte range of one (its start a multiple of the
/// adapter's `min_storage_buffer_offset_alignment`), so that a tensor larger than one binding
/// can be read a piece at a time.
#[derive(Clone, Copy)]
pub(crate) struct Binding<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    /// `(start, size)` in bytes; `None` binds the whole buffer.
    pub(crate) range: Option<(u64, u64)>,
}

impl<'a> From<&'a wgpu::Buffer> for Binding<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Binding<'a> {
        Binding { buffer, range: None }
    }
}

impl Binding<'_> {
    /// The bytes the binding covers.
    pub(crate) fn size(&self) -> u64 {
        self.range.map_or(self.buffer.size(), |(_, size)| size)
    }
}

/// A kernel's bindings after the uniform: buffers in binding order.
pub(crate) struct Launch<'a> {
    pub(crate) key: &'static str,
    pub(crate) source: &'static str,
    pub(crate) entry: &'static str,
    /// The uniform parameters (binding 0): the bytes of the kernel's parameter block (see
    /// `launch::Uniform`).
    pub(crate) params: &'a [u8],
    /// Storage buffers, bindings 1.. in order.
    pub(crate) buffers: &'a [Binding<'a>],
    /// Invocations needed; the grid covers them with [`WORKGROUP`]-wide groups.
    pub(crate) invocations: u64,
}

#[cfg(test)]
thread_local! {
    /// A lower binding limit for the tests of this thread, so that splitting a tensor across
    /// bindings is tested on small tensors.
    pub(crate) static TEST_BINDING_LIMIT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

impl Gpu {
    /// The largest storage binding the adapter takes, in bytes.
    pub(crate) fn binding_limit(&self) -> u64 {
        let limit = self.limits().max_storage_buffer_binding_size;
        #[cfg(test)]
        let limit = TEST_BINDING_LIMIT.with(|test| test.get()).map_or(limit, |test| test.min(limit));
        limit
    }

    /// Encodes and submits one dispatch.
    pub(crate) fn launch(&self, launch: &Launch<'_>) -> Result<()> {
        let groups = launch.invocations.div_ceil(u64::from(WORKGROUP)).max(1);
        let y = groups.div_ceil(u64::from(MAX_GROUPS));
        let x = groups.min(u64::from(MAX_GROUPS));
        if y > u64::from(MAX_GROUPS) {
            return Err(self.fail(launch.key, format!("{} invocations exceed one dispatch", launch.invocations)));
        }
        // wgpu panics on a binding past the adapter's limit: refuse it with an error instead.
        let limit = self.binding_limit();
        if let Some(binding) = launch.buffers.iter().find(|binding| binding.size() > limit) {
            return Err(self.fail(
                launch.key,
                format!(
                    "a tensor of {} bytes exceeds the adapter's largest storage binding ({limit} bytes): \
                     use smaller tensors (a half-precision dtype, fewer rows at a time) or an adapter with larger bindings",
                    binding.size()
                ),
            ));
        }
        let pipeline = self.pipeline(launch.key, launch.source, launch.entry)?;
        // Every launch is built valid; should one not be, it is an error here, not wgpu's panic.
        let scope = self.device().push_error_scope(wgpu::ErrorFilter::Validation);
        // Uniform blocks are read in 16-byte rows: the block is padded with zeros to whole rows.
        let mut bytes = launch.params.to_vec();
        bytes.resize(bytes.len().div_ceil(16).max(1) * 16, 0);
        let uniform = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(launch.key),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue().write_buffer(&uniform, 0, &bytes);
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        for (at, binding) in launch.buffers.iter().enumerate() {
            let resource = match binding.range {
                None => binding.buffer.as_entire_binding(),
                Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: binding.buffer,
                    offset,
                    size: wgpu::BufferSize::new(size),
                }),
            };
            entries.push(wgpu::BindGroupEntry { binding: at as u32 + 1, resource });
        }
        let layout = pipeline.get_bind_group_layout(0);
        let group = self.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(launch.key),
            layout: &layout,
            entries: &entries,
        });
        let mut encoder =
            self.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(launch.key) });
        {
            let mut pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(launch.key), timestamp_writes: None });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(x as u32, y as u32, 1);
        }
        self.queue().submit([encoder.finish()]);
        match pollster::block_on(scope.pop()) {
            Some(error) => Err(self.fail(launch.key, error)),
            None => Ok(()),
        }
    }
}
