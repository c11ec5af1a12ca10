//! What a file that is not SafeTensors looks like, for [`super::Error::NotSafeTensors`].

use std::fmt;

/// What a file that is not SafeTensors looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A zip archive holding `data.pkl`: `torch.save` since PyTorch 1.6.
    PyTorchZip,
    /// A bare pickle stream: `torch.save` before 1.6, or a pickled object.
    Pickle,
    /// A GGUF file (llama.cpp).
    Gguf,
    /// A NumPy `.npy` array.
    Npy,
    /// A zip of `.npy` arrays: NumPy `.npz`.
    Npz,
    /// Some other zip archive.
    Zip,
    /// HDF5 (Keras `.h5`).
    Hdf5,
    /// Text rather than a binary file (JSON, an HTML error page, a Git LFS pointer).
    Text,
}

impl FileKind {
    /// What to do with such a file.
    pub fn advice(self) -> &'static str {
        match self {
            FileKind::PyTorchZip | FileKind::Pickle => {
                "nnx reads PyTorch checkpoints under any name not ending in `.safetensors` (`.bin`, `.pt`, `.pth`): rename it, or convert it with `safetensors.torch.save_file(torch.load(path, weights_only=True), out)` in Python"
            }
            FileKind::Gguf => "GGUF is llama.cpp's format: download the SafeTensors weights of the model instead",
            FileKind::Npy | FileKind::Npz => "convert it with `safetensors.numpy.save_file(dict, out)` in Python",
            FileKind::Zip => "unpack it and pass the `.safetensors` file inside",
            FileKind::Hdf5 => "export the weights to SafeTensors from Keras or h5py first",
            FileKind::Text => {
                "it may be a Git LFS pointer or an error page saved instead of the weights: download the file itself"
            }
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::PyTorchZip => "a PyTorch checkpoint (zip, `torch.save`)",
            FileKind::Pickle => "a Python pickle (a legacy PyTorch checkpoint)",
            FileKind::Gguf => "a GGUF file",
            FileKind::Npy => "a NumPy `.npy` array",
            FileKind::Npz => "a NumPy `.npz` archive",
            FileKind::Zip => "a zip archive",
            FileKind::Hdf5 => "an HDF5 file",
            FileKind::Text => "a text file",
        })
    }
}
