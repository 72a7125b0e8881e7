//! [`Registry`]: a fixed-capacity set of labelled slots, one per engine rank or replica.

use crate::slot::{SeqSlot, SlotReader, SlotWriter};
use crate::words::Words;
use heapless::{String, Vec};

/// Longest label a registry entry may have, in bytes.
pub const MAX_LABEL: usize = 32;

/// Why [`Registry::add`] refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum RegistryError {
    /// All `N` entries are taken.
    Full,
    /// The label is longer than [`MAX_LABEL`] bytes.
    LabelTooLong,
    /// Another entry has this label.
    DuplicateLabel,
}

impl core::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Full => "registry is full",
            Self::LabelTooLong => "label longer than 32 bytes",
            Self::DuplicateLabel => "label already registered",
        })
    }
}

impl core::error::Error for RegistryError {}

/// Up to `N` slots, each with a label (`"rank0"`, `"replica-3"`, …).
///
/// ```
/// use specula_core::{Registry, Snapshot};
/// let mut reg: Registry<Snapshot<4>, 8> = Registry::new();
/// reg.add("rank0", Snapshot::ZERO).unwrap();
/// reg.add("rank1", Snapshot::ZERO).unwrap();
/// let (writers, readers) = reg.split();
/// assert_eq!(writers.len(), 2);
/// assert_eq!(readers.iter().map(|(l, _)| l).collect::<Vec<_>>(), ["rank0", "rank1"]);
/// ```
pub struct Registry<T: Words, const N: usize> {
    entries: Vec<(String<MAX_LABEL>, SeqSlot<T>), N>,
}

impl<T: Words, const N: usize> Default for Registry<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Words, const N: usize> Registry<T, N> {
    /// An empty registry.
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// Adds a slot labelled `label` holding `initial`; returns its index.
    pub fn add(&mut self, label: &str, initial: T) -> Result<usize, RegistryError> {
        if self.entries.iter().any(|(l, _)| l == label) {
            return Err(RegistryError::DuplicateLabel);
        }
        let label = String::try_from(label).map_err(|_| RegistryError::LabelTooLong)?;
        self.entries
            .push((label, SeqSlot::new(initial)))
            .map_err(|_| RegistryError::Full)?;
        Ok(self.entries.len() - 1)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if no entry was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Splits every slot: the writers in insertion order, and one `Copy` reader of them all.
    pub fn split(&mut self) -> (Vec<SlotWriter<'_, T>, N>, RegistryReader<'_, T, N>) {
        // Holding `&mut self` for the handles' lifetime is what makes each writer unique,
        // exactly as in `SeqSlot::split`.
        let this: &Self = self;
        let mut writers = Vec::new();
        for (_, slot) in this.entries.iter() {
            // Cannot fail: at most N entries.
            let _ = writers.push(SlotWriter::new(slot));
        }
        (writers, RegistryReader { reg: this })
    }
}

/// Reads every slot of a [`Registry`]; `Copy`.
pub struct RegistryReader<'a, T: Words, const N: usize> {
    reg: &'a Registry<T, N>,
}

impl<T: Words, const N: usize> Clone for RegistryReader<'_, T, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Words, const N: usize> Copy for RegistryReader<'_, T, N> {}

impl<'a, T: Words, const N: usize> RegistryReader<'a, T, N> {
    /// `(label, reader)` for each entry, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, SlotReader<'a, T>)> + 'a {
        let reg = self.reg;
        reg.entries.iter().map(|(l, s)| (l.as_str(), s.reader()))
    }

    /// The reader of the entry labelled `label`.
    pub fn get(&self, label: &str) -> Option<SlotReader<'a, T>> {
        self.iter().find(|(l, _)| *l == label).map(|(_, r)| r)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.reg.len()
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        self.reg.is_empty()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn errors_are_typed() {
        let mut reg: Registry<u64, 2> = Registry::new();
        assert_eq!(reg.add("a", 0), Ok(0));
        assert_eq!(reg.add("a", 0), Err(RegistryError::DuplicateLabel));
        assert_eq!(
            reg.add("this label is much longer than thirty-two bytes", 0),
            Err(RegistryError::LabelTooLong)
        );
        assert_eq!(reg.add("b", 0), Ok(1));
        assert_eq!(reg.add("c", 0), Err(RegistryError::Full));
        let (mut ws, rd) = reg.split();
        ws[1].publish(&5);
        assert_eq!(rd.get("b").unwrap().read(), (5, 1));
        assert_eq!(rd.get("a").unwrap().read(), (0, 0));
        assert!(rd.get("z").is_none());
    }
}
