// A host layer given a GPU tensor: refused at compile time, with how to move it.
use nnx::nn::Linear;
use nnx::{DType, Gpu, Tensor};

fn main() -> nnx::Result<()> {
    let gpu = Gpu::open(0)?;
    let layer = Linear::builder(2, 2).build();
    let x = Tensor::zeros(DType::F32, &[1, 2]).to_device(&gpu)?;
    let _ = layer.forward(&x);
    Ok(())
}
