// A host tensor and a GPU tensor in one operation: refused at compile time, in both orders.
use nnx::{DType, Gpu, Tensor};

fn main() -> nnx::Result<()> {
    let gpu = Gpu::open(0)?;
    let host = Tensor::zeros(DType::F32, &[2, 2]);
    let on_gpu = host.to_device(&gpu)?;
    let _ = host.add(&on_gpu);
    let _ = on_gpu.matmul(&host);
    Ok(())
}
