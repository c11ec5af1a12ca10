//! SafeTensors, the format nnx writes: the header (`header`), a file mapped with it
//! (`mapped`), shard indexes (`index`) and atomic, optionally page-aligned or sharded saves
//! (`write`).

pub(crate) mod header;
pub(crate) mod index;
pub(crate) mod mapped;
pub(crate) mod write;
