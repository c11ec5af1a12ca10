//! Running a kernel: a uniform block of parameters, storage bindings, and a grid of 256-wide
//! workgroups folded into two dimensions (at most 65,535 workgroups per dimension).

use super::Gpu;
use crate::error::Result;

/// Invocations per workgroup of every kernel.
pub(crate) const WORKGROUP: u32 = 256;

/// The most workgroups along one dimension of a dispatch.
const MAX_GROUPS: u32 = 65_535;

/// A kernel's bindings after the uniform: buffers in binding order.
pub(crate) struct Launch<'a> {
    pub(crate) key: &'static str,
    pub(crate) source: &'static str,
    pub(crate) entry: &'static str,
    /// The uniform parameters (binding 0), as 32-bit words.
    pub(crate) params: &'a [u32],
    /// Storage buffers, bindings 1.. in order.
    pub(crate) buffers: &'a [&'a wgpu::Buffer],
    /// Invocations needed; the grid covers them with [`WORKGROUP`]-wide groups.
    pub(crate) invocations: u64,
}

impl Gpu {
    /// Encodes and submits one dispatch.
    pub(crate) fn launch(&self, launch: &Launch<'_>) -> Result<()> {
        let groups = launch.invocations.div_ceil(u64::from(WORKGROUP)).max(1);
        let y = groups.div_ceil(u64::from(MAX_GROUPS));
        let x = groups.min(u64::from(MAX_GROUPS));
        if y > u64::from(MAX_GROUPS) {
            return Err(self.fail(launch.key, format!("{} invocations exceed one dispatch", launch.invocations)));
        }
        let pipeline = self.pipeline(launch.key, launch.source, launch.entry);
        // Uniform blocks are read in 16-byte rows.
        let mut words = launch.params.to_vec();
        words.resize(words.len().div_ceil(4).max(1) * 4, 0);
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        let uniform = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(launch.key),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue().write_buffer(&uniform, 0, &bytes);
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        for (at, buffer) in launch.buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: at as u32 + 1, resource: buffer.as_entire_binding() });
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
        Ok(())
    }
}
