//! The budget every reader keeps the text it builds under (metadata, entry and shard names,
//! a pickle's plain values), whatever the format: memory follows what a file holds, never how
//! its syntax or its references multiply it.

/// The most bytes of metadata a reader keeps for one file: the text of every key and value,
/// plus [`METADATA_ENTRY_BYTES`] per entry for the map that holds it. Far more than any
/// checkpoint carries; a file that reaches it (a value referenced over and over, millions of
/// tiny entries) is refused rather than left to exhaust memory.
pub(crate) const MAX_METADATA_BYTES: usize = 64 << 20;

/// What each metadata entry is counted as beyond its text: about what a map node and two
/// string allocations take.
pub(crate) const METADATA_ENTRY_BYTES: usize = 64;

/// Counts the bytes a reader keeps against a limit.
pub(crate) struct TextBudget {
    used: usize,
    pub(crate) limit: usize,
}

impl TextBudget {
    /// A budget of [`MAX_METADATA_BYTES`].
    pub(crate) fn new() -> TextBudget {
        TextBudget { used: 0, limit: MAX_METADATA_BYTES }
    }

    /// The most text one more entry may hold.
    pub(crate) fn room(&self) -> usize {
        self.limit.saturating_sub(self.used).saturating_sub(METADATA_ENTRY_BYTES)
    }

    /// The total that one more entry of `text` bytes asks for.
    pub(crate) fn asked(&self, text: usize) -> usize {
        self.used.saturating_add(text).saturating_add(METADATA_ENTRY_BYTES)
    }

    /// Takes one entry of `text` bytes; `Err` with the total asked when that passes the limit.
    pub(crate) fn take_entry(&mut self, text: usize) -> Result<(), usize> {
        let asked = self.asked(text);
        if asked > self.limit {
            return Err(asked);
        }
        self.used = asked;
        Ok(())
    }
}
