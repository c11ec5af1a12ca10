//! The model families nnx builds, one row each: the names `config.json`'s `model_type` and a
//! GGUF file's `general.architecture` give them, and the type of `nnx::models` that computes
//! them. The loader, the import plan, the GGUF export, the adapters' renaming and the command
//! line's lists and errors all read this table; a family is added by a row here and its model
//! file.

/// The type of [`crate::models`] a family's files are built into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// [`Llama`](super::llama::Llama) (Llama, Mistral).
    Llama,
    /// [`Qwen`](super::qwen::Qwen) (Qwen 2, Qwen 3).
    Qwen,
    /// [`Gemma3`](super::gemma3::Gemma3).
    Gemma3,
    /// [`GptOss`](super::gpt_oss::GptOss).
    GptOss,
    /// [`Qwen35`](super::qwen35::Qwen35) (Qwen3.5 and Qwen3.6, dense and MoE).
    Qwen35,
    /// [`Gemma4`](super::gemma4::Gemma4) (Gemma 4's dense text models).
    Gemma4,
    /// [`Gpt2`](super::gpt2::Gpt2).
    Gpt2,
    /// [`Bert`](super::bert::Bert), an encoder: it embeds text and generates none.
    Bert,
}

impl Network {
    /// Whether its model also reads llama.cpp's GGUF names (its fields carry `gguf`
    /// attributes).
    pub fn reads_gguf(self) -> bool {
        matches!(
            self,
            Network::Llama | Network::Qwen | Network::Gemma3 | Network::GptOss | Network::Qwen35 | Network::Gemma4
        )
    }

    /// How its GGUF files shape their attention heads: one width turned whole (most), one
    /// width turned in part (Qwen3.5), or per layer (Gemma 4).
    pub fn heads(self) -> super::decoder::Heads {
        match self {
            Network::Qwen35 => super::decoder::Heads::Partial,
            Network::Gemma4 => super::decoder::Heads::PerLayer,
            _ => super::decoder::Heads::Whole,
        }
    }
}

/// One family: its name and the names its files give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// The name nnx reports (`LoadedModel::architecture`) and takes (`nnx inspect --model`).
    pub name: &'static str,
    /// The type it is built into.
    pub network: Network,
    /// The `model_type` values of its `config.json`.
    pub model_types: &'static [&'static str],
    /// The `general.architecture` values of its GGUF files (none: nnx reads its GGUF files
    /// under another family's name, or not at all).
    pub gguf_architectures: &'static [&'static str],
    /// Whether `nnx convert` writes its transformers folders as GGUF files.
    pub exports_gguf: bool,
}

impl Family {
    /// Whether it generates text (a decoder), rather than embedding it.
    pub fn generates(&self) -> bool {
        self.network != Network::Bert
    }
}

/// Every family nnx builds. Mistral's GGUF files are Llama's (llama.cpp writes them as
/// `llama`), so `mistral` names no GGUF architecture.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "llama",
        network: Network::Llama,
        model_types: &["llama"],
        gguf_architectures: &["llama"],
        exports_gguf: true,
    },
    Family {
        name: "mistral",
        network: Network::Llama,
        model_types: &["mistral"],
        gguf_architectures: &[],
        exports_gguf: false,
    },
    Family {
        name: "qwen2",
        network: Network::Qwen,
        model_types: &["qwen2"],
        gguf_architectures: &["qwen2"],
        exports_gguf: false,
    },
    Family {
        name: "qwen3",
        network: Network::Qwen,
        model_types: &["qwen3"],
        gguf_architectures: &["qwen3"],
        exports_gguf: false,
    },
    Family {
        name: "qwen3moe",
        network: Network::Qwen,
        model_types: &["qwen3_moe"],
        gguf_architectures: &["qwen3moe"],
        exports_gguf: false,
    },
    Family {
        name: "gemma3",
        network: Network::Gemma3,
        model_types: &["gemma3_text", "gemma3"],
        gguf_architectures: &["gemma3"],
        exports_gguf: false,
    },
    Family {
        name: "gpt-oss",
        network: Network::GptOss,
        model_types: &["gpt_oss"],
        gguf_architectures: &["gpt-oss"],
        exports_gguf: false,
    },
    Family {
        name: "qwen35",
        network: Network::Qwen35,
        model_types: &["qwen3_5_text", "qwen3_5"],
        gguf_architectures: &["qwen35"],
        exports_gguf: true,
    },
    Family {
        name: "qwen35moe",
        network: Network::Qwen35,
        model_types: &["qwen3_5_moe_text", "qwen3_5_moe"],
        gguf_architectures: &["qwen35moe"],
        exports_gguf: true,
    },
    Family {
        name: "gemma4",
        network: Network::Gemma4,
        model_types: &["gemma4_text", "gemma4"],
        gguf_architectures: &["gemma4"],
        exports_gguf: true,
    },
    Family {
        name: "gpt2",
        network: Network::Gpt2,
        model_types: &["gpt2"],
        gguf_architectures: &[],
        exports_gguf: false,
    },
    Family {
        name: "bert",
        network: Network::Bert,
        model_types: &["bert"],
        gguf_architectures: &[],
        exports_gguf: false,
    },
];

/// Encoders nnx does not build, by `config.json`'s `model_type` or a GGUF file's
/// `general.architecture`: the loader tells them from decoders it does not know, and names
/// `nnx embed` for them.
pub const ENCODERS: &[&str] = &[
    "roberta",
    "xlm-roberta",
    "distilbert",
    "camembert",
    "albert",
    "electra",
    "mpnet",
    "deberta",
    "deberta-v2",
    "modernbert",
    "nomic_bert",
    "bert",
    "nomic-bert",
    "nomic-bert-moe",
    "jina-bert-v2",
    "modern-bert",
    "neo-bert",
];

/// The family whose `config.json` says `model_type`.
pub fn from_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|family| family.model_types.contains(&model_type))
}

/// The family whose GGUF files say `architecture` in `general.architecture`.
pub fn from_gguf_architecture(architecture: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|family| family.gguf_architectures.contains(&architecture))
}

/// The family a user names: by its name or by one of its `model_type` values.
pub fn from_name(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|family| family.name == name).or_else(|| from_model_type(name))
}

/// Every name [`from_name`] takes, families first, then the other `model_type` values.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = FAMILIES.iter().map(|family| family.name).collect();
    for model_type in FAMILIES.iter().flat_map(|family| family.model_types) {
        if !names.contains(model_type) {
            names.push(model_type);
        }
    }
    names
}

/// The families that generate text, by their `config.json` names (`llama, mistral, ...`) or
/// their GGUF names: what the errors for another architecture list.
pub fn supported(gguf: bool) -> String {
    let names: Vec<&str> = FAMILIES
        .iter()
        .filter(|family| family.generates())
        .flat_map(|family| if gguf { family.gguf_architectures } else { &family.model_types[..1] })
        .copied()
        .collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_finds_one_family() {
        for family in FAMILIES {
            assert_eq!(from_name(family.name), Some(family));
            for model_type in family.model_types {
                assert_eq!(from_model_type(model_type), Some(family), "{model_type}");
            }
            for architecture in family.gguf_architectures {
                assert_eq!(from_gguf_architecture(architecture), Some(family), "{architecture}");
            }
        }
        let names = names();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "{names:?}");
        assert_eq!(from_gguf_architecture("mistral"), None, "llama.cpp writes Mistral as `llama`");
        assert_eq!(supported(true), "llama, qwen2, qwen3, qwen3moe, gemma3, gpt-oss, qwen35, qwen35moe, gemma4");
        assert_eq!(
            supported(false),
            "llama, mistral, qwen2, qwen3, qwen3_moe, gemma3_text, gpt_oss, qwen3_5_text, qwen3_5_moe_text, gemma4_text, gpt2"
        );
    }
}
