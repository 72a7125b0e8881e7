//! [`Counters`]: cumulative speculative-decoding counts, and [`Snapshot`]: what a collector
//! publishes.

use crate::metrics::{Cell64, Words};

/// Cumulative verification counts, with per-position counts up to draft length `K`.
///
/// # Overflow
/// Every field is a `u64` that only grows, updated with wrapping addition (as the GPU kernels'
/// 64-bit atomics do). At a billion tokens a second a `u64` lasts 584 years, so in practice the
/// values never wrap; if one did, [`Counters::delta_since`] still gives the right delta because
/// it subtracts with wrapping too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Counters<const K: usize> {
    /// Verification steps with at least one draft token.
    pub drafts: u64,
    /// Draft tokens proposed (Σ k).
    pub draft_tokens: u64,
    /// Draft tokens accepted (Σ accepted prefix length).
    pub accepted_tokens: u64,
    /// Tokens emitted: accepted plus the one recovered or bonus token per draft.
    pub emitted_tokens: u64,
    /// `accepted_per_position[i]`: drafts whose token at position `i` was accepted.
    pub accepted_per_position: [u64; K],
    /// `drafted_per_position[i]`: drafts that had a token at position `i` (k > i).
    pub drafted_per_position: [u64; K],
    /// Of [`drafts`](Self::drafts), those that were token trees (recorded by
    /// [`record_tree`](Self::record_tree); a tree of the root alone is not counted).
    pub tree_drafts: u64,
    /// Draft nodes of those trees (Σ nodes, the root excluded): the tree's
    /// [`draft_tokens`](Self::draft_tokens) in the chain's sense. Mean tree size =
    /// `tree_draft_tokens / tree_drafts` ([`mean_tree_size`](Self::mean_tree_size)).
    pub tree_draft_tokens: u64,
}

/// Why [`Counters::record`] refused a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum CountError {
    /// `k == 0`: nothing was drafted.
    EmptyDraft,
    /// `k` exceeds the compile-time maximum `K`.
    DraftTooLong {
        /// The draft length given.
        k: usize,
        /// The maximum.
        max: usize,
    },
    /// More tokens accepted than drafted.
    AcceptedExceedsDraft {
        /// Accepted count given.
        accepted: usize,
        /// Draft length given.
        k: usize,
    },
    /// A tree with fewer draft nodes than its depth (every depth holds at least one node).
    NodesBelowDepth {
        /// Draft nodes given (the root excluded).
        nodes: usize,
        /// Depth given.
        depth: usize,
    },
}

impl core::fmt::Display for CountError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::EmptyDraft => f.write_str("draft length k is 0"),
            Self::DraftTooLong { k, max } => write!(f, "draft length {k} exceeds maximum {max}"),
            Self::AcceptedExceedsDraft { accepted, k } => {
                write!(f, "{accepted} tokens accepted of a {k}-token draft")
            }
            Self::NodesBelowDepth { nodes, depth } => {
                write!(f, "a tree of depth {depth} with only {nodes} draft nodes")
            }
        }
    }
}

impl core::error::Error for CountError {}

impl<const K: usize> Default for Counters<K> {
    fn default() -> Self {
        Self::ZERO
    }
}

impl<const K: usize> Counters<K> {
    /// All zero.
    pub const ZERO: Self = Self {
        drafts: 0,
        draft_tokens: 0,
        accepted_tokens: 0,
        emitted_tokens: 0,
        accepted_per_position: [0; K],
        drafted_per_position: [0; K],
        tree_drafts: 0,
        tree_draft_tokens: 0,
    };

    /// Records one verification step: a `k`-token draft of which the first `accepted` were
    /// accepted (and one more token emitted). Nothing is changed on error.
    pub fn record(&mut self, k: usize, accepted: usize) -> Result<(), CountError> {
        if k == 0 {
            return Err(CountError::EmptyDraft);
        }
        if k > K {
            return Err(CountError::DraftTooLong { k, max: K });
        }
        if accepted > k {
            return Err(CountError::AcceptedExceedsDraft { accepted, k });
        }
        self.drafts = self.drafts.wrapping_add(1);
        self.draft_tokens = self.draft_tokens.wrapping_add(k as u64);
        self.accepted_tokens = self.accepted_tokens.wrapping_add(accepted as u64);
        self.emitted_tokens = self.emitted_tokens.wrapping_add(accepted as u64 + 1);
        for c in &mut self.accepted_per_position[..accepted] {
            *c = c.wrapping_add(1);
        }
        for c in &mut self.drafted_per_position[..k] {
            *c = c.wrapping_add(1);
        }
        Ok(())
    }

    /// Records one verified token tree of `depth` with `nodes` draft nodes (the root excluded)
    /// whose accepted path has `accepted` nodes: the tree is counted as a chain of its depth
    /// ([`record`](Self::record)`(depth, accepted)`: the per-position counts are per-depth
    /// counts), and [`tree_drafts`](Self::tree_drafts) / [`tree_draft_tokens`](Self::tree_draft_tokens)
    /// add 1 and `nodes`. Nothing is changed on error.
    ///
    /// ```
    /// use specula_core::Counters;
    /// let mut c = Counters::<4>::ZERO;
    /// c.record_tree(2, 6, 1).unwrap(); // a 2x2 tree, one node accepted
    /// assert_eq!((c.drafts, c.draft_tokens, c.tree_drafts, c.tree_draft_tokens), (1, 2, 1, 6));
    /// assert_eq!(c.mean_tree_size(), Some(6.0));
    /// ```
    pub fn record_tree(
        &mut self,
        depth: usize,
        nodes: usize,
        accepted: usize,
    ) -> Result<(), CountError> {
        if depth != 0 && nodes < depth {
            return Err(CountError::NodesBelowDepth { nodes, depth });
        }
        self.record(depth, accepted)?;
        self.tree_drafts = self.tree_drafts.wrapping_add(1);
        self.tree_draft_tokens = self.tree_draft_tokens.wrapping_add(nodes as u64);
        Ok(())
    }

    /// Adds every field of `other` (wrapping): merges counts of several ranks or threads.
    pub fn add(&mut self, other: &Self) {
        self.zip_mut(other, u64::wrapping_add);
    }

    /// `self − earlier`, field by field (wrapping): the counts recorded in between.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        let mut d = *self;
        d.zip_mut(earlier, u64::wrapping_sub);
        d
    }

    /// True if no field of `self` is below the same field of `earlier`.
    pub fn dominates(&self, earlier: &Self) -> bool {
        let mut ok = true;
        self.for_each_pair(earlier, |a, b| ok &= a >= b);
        ok
    }

    /// True if every field is zero.
    pub fn is_zero(&self) -> bool {
        self.dominates(&Self::ZERO) && Self::ZERO.dominates(self)
    }

    fn zip_mut(&mut self, other: &Self, f: impl Fn(u64, u64) -> u64) {
        self.drafts = f(self.drafts, other.drafts);
        self.draft_tokens = f(self.draft_tokens, other.draft_tokens);
        self.accepted_tokens = f(self.accepted_tokens, other.accepted_tokens);
        self.emitted_tokens = f(self.emitted_tokens, other.emitted_tokens);
        for (a, b) in self
            .accepted_per_position
            .iter_mut()
            .zip(&other.accepted_per_position)
        {
            *a = f(*a, *b);
        }
        for (a, b) in self
            .drafted_per_position
            .iter_mut()
            .zip(&other.drafted_per_position)
        {
            *a = f(*a, *b);
        }
        self.tree_drafts = f(self.tree_drafts, other.tree_drafts);
        self.tree_draft_tokens = f(self.tree_draft_tokens, other.tree_draft_tokens);
    }

    fn for_each_pair(&self, other: &Self, mut f: impl FnMut(u64, u64)) {
        f(self.drafts, other.drafts);
        f(self.draft_tokens, other.draft_tokens);
        f(self.accepted_tokens, other.accepted_tokens);
        f(self.emitted_tokens, other.emitted_tokens);
        for (a, b) in self
            .accepted_per_position
            .iter()
            .zip(&other.accepted_per_position)
        {
            f(*a, *b);
        }
        for (a, b) in self
            .drafted_per_position
            .iter()
            .zip(&other.drafted_per_position)
        {
            f(*a, *b);
        }
        f(self.tree_drafts, other.tree_drafts);
        f(self.tree_draft_tokens, other.tree_draft_tokens);
    }
}

/// Atomic storage for [`Counters`] inside a [`SeqSlot`](crate::SeqSlot).
#[derive(Debug)]
pub struct CountersStorage<const K: usize> {
    head: [Cell64; 4],
    accepted: [Cell64; K],
    drafted: [Cell64; K],
    tree: [Cell64; 2],
}

/// Storage holding zero counters.
impl<const K: usize> Default for CountersStorage<K> {
    fn default() -> Self {
        Self {
            head: Default::default(),
            accepted: core::array::from_fn(|_| Cell64::default()),
            drafted: core::array::from_fn(|_| Cell64::default()),
            tree: Default::default(),
        }
    }
}

impl<const K: usize> Words for Counters<K> {
    type Storage = CountersStorage<K>;
    fn to_storage(&self) -> Self::Storage {
        CountersStorage {
            head: [
                self.drafts,
                self.draft_tokens,
                self.accepted_tokens,
                self.emitted_tokens,
            ]
            .to_storage(),
            accepted: self.accepted_per_position.to_storage(),
            drafted: self.drafted_per_position.to_storage(),
            tree: [self.tree_drafts, self.tree_draft_tokens].to_storage(),
        }
    }
    #[inline]
    fn store(&self, s: &Self::Storage) {
        [
            self.drafts,
            self.draft_tokens,
            self.accepted_tokens,
            self.emitted_tokens,
        ]
        .store(&s.head);
        self.accepted_per_position.store(&s.accepted);
        self.drafted_per_position.store(&s.drafted);
        [self.tree_drafts, self.tree_draft_tokens].store(&s.tree);
    }
    #[inline]
    fn load(s: &Self::Storage) -> Self {
        let [drafts, draft_tokens, accepted_tokens, emitted_tokens] = <[u64; 4]>::load(&s.head);
        let [tree_drafts, tree_draft_tokens] = <[u64; 2]>::load(&s.tree);
        Self {
            drafts,
            draft_tokens,
            accepted_tokens,
            emitted_tokens,
            accepted_per_position: Words::load(&s.accepted),
            drafted_per_position: Words::load(&s.drafted),
            tree_drafts,
            tree_draft_tokens,
        }
    }
}

/// What a [`Collector`](crate::Collector) publishes: device totals and when they were taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Snapshot<const K: usize> {
    /// Cumulative counts since the device counters were created.
    pub counters: Counters<K>,
    /// Clock time (ns) of the point the counters represent: when the readback was started.
    pub at_ns: u64,
    /// Readbacks that failed (or returned decreasing counts) so far; on a failure the last good
    /// counters are published again with this raised.
    pub readback_errors: u64,
}

impl<const K: usize> Snapshot<K> {
    /// Zero counts at time 0.
    pub const ZERO: Self = Self {
        counters: Counters::ZERO,
        at_ns: 0,
        readback_errors: 0,
    };
}

impl<const K: usize> Default for Snapshot<K> {
    fn default() -> Self {
        Self::ZERO
    }
}

impl<const K: usize> Words for Snapshot<K> {
    type Storage = (CountersStorage<K>, [Cell64; 2]);
    fn to_storage(&self) -> Self::Storage {
        (
            self.counters.to_storage(),
            [self.at_ns, self.readback_errors].to_storage(),
        )
    }
    #[inline]
    fn store(&self, s: &Self::Storage) {
        self.counters.store(&s.0);
        [self.at_ns, self.readback_errors].store(&s.1);
    }
    #[inline]
    fn load(s: &Self::Storage) -> Self {
        let [at_ns, readback_errors] = <[u64; 2]>::load(&s.1);
        Self {
            counters: Counters::load(&s.0),
            at_ns,
            readback_errors,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn record_counts_every_field() {
        let mut c = Counters::<4>::ZERO;
        c.record(3, 2).unwrap();
        c.record(4, 0).unwrap();
        c.record(1, 1).unwrap();
        assert_eq!(c.drafts, 3);
        assert_eq!(c.draft_tokens, 8);
        assert_eq!(c.accepted_tokens, 3);
        assert_eq!(c.emitted_tokens, 6);
        assert_eq!(c.accepted_per_position, [2, 1, 0, 0]);
        assert_eq!(c.drafted_per_position, [3, 2, 2, 1]);
    }

    #[test]
    fn bad_steps_change_nothing() {
        let mut c = Counters::<2>::ZERO;
        c.record(2, 1).unwrap();
        let before = c;
        assert_eq!(c.record(0, 0), Err(CountError::EmptyDraft));
        assert_eq!(
            c.record(3, 0),
            Err(CountError::DraftTooLong { k: 3, max: 2 })
        );
        assert_eq!(
            c.record(1, 2),
            Err(CountError::AcceptedExceedsDraft { accepted: 2, k: 1 })
        );
        assert_eq!(c, before);
    }

    #[test]
    fn record_tree_counts_a_chain_of_its_depth_and_its_nodes() {
        let mut c = Counters::<4>::ZERO;
        c.record_tree(3, 14, 2).unwrap();
        c.record(4, 1).unwrap(); // a chain in the same counters
        c.record_tree(1, 4, 0).unwrap();
        let mut chain = Counters::<4>::ZERO;
        chain.record(3, 2).unwrap();
        chain.record(4, 1).unwrap();
        chain.record(1, 0).unwrap();
        assert_eq!((c.tree_drafts, c.tree_draft_tokens), (2, 18));
        assert_eq!(c.mean_tree_size(), Some(9.0));
        c.tree_drafts = 0;
        c.tree_draft_tokens = 0;
        assert_eq!(c, chain, "the chain fields are record(depth, accepted)'s");
        let before = c;
        assert_eq!(
            c.record_tree(3, 2, 0),
            Err(CountError::NodesBelowDepth { nodes: 2, depth: 3 })
        );
        assert_eq!(c.record_tree(0, 0, 0), Err(CountError::EmptyDraft));
        assert_eq!(
            c.record_tree(5, 9, 0),
            Err(CountError::DraftTooLong { k: 5, max: 4 })
        );
        assert_eq!(
            c.record_tree(2, 3, 3),
            Err(CountError::AcceptedExceedsDraft { accepted: 3, k: 2 })
        );
        assert_eq!(c, before, "nothing changed on error");
        // A path-shaped tree has as many nodes as its depth.
        c.record_tree(3, 3, 3).unwrap();
        assert_eq!((c.tree_drafts, c.tree_draft_tokens), (1, 3));
    }

    #[test]
    fn tree_fields_take_part_in_add_delta_and_dominates() {
        let mut a = Counters::<2>::ZERO;
        a.tree_draft_tokens = u64::MAX;
        let mut b = a;
        b.record_tree(2, 6, 1).unwrap();
        let d = b.delta_since(&a);
        assert_eq!((d.tree_drafts, d.tree_draft_tokens), (1, 6));
        let mut back = a;
        back.add(&d);
        assert_eq!(back, b);
        let mut c = b;
        c.tree_drafts -= 1;
        assert!(!c.dominates(&b) && b.dominates(&c));
        let mut e = b;
        e.tree_draft_tokens -= 1;
        assert!(!e.dominates(&b) && b.dominates(&e));
        let mut z = Counters::<2>::ZERO;
        z.tree_draft_tokens = 1;
        assert!(!z.is_zero());
    }

    #[test]
    fn delta_and_add_are_inverse_even_across_wrap() {
        let mut a = Counters::<2>::ZERO;
        a.drafts = u64::MAX - 1;
        let mut b = a;
        b.record(2, 2).unwrap();
        b.record(2, 1).unwrap();
        let d = b.delta_since(&a);
        assert_eq!(d.drafts, 2);
        assert_eq!(d.accepted_per_position, [2, 1]);
        let mut back = a;
        back.add(&d);
        assert_eq!(back, b);
        assert!(b.drafts < a.drafts, "wrapped");
    }

    #[test]
    fn dominates_detects_any_decrease() {
        let mut a = Counters::<3>::ZERO;
        a.record(3, 3).unwrap();
        let mut b = a;
        assert!(b.dominates(&a) && a.dominates(&b));
        b.drafted_per_position[2] -= 1;
        assert!(!b.dominates(&a));
        assert!(a.dominates(&b));
        assert!(Counters::<3>::ZERO.is_zero() && !a.is_zero());
    }

    #[test]
    fn snapshot_round_trips_through_words() {
        let mut c = Counters::<3>::ZERO;
        c.record(3, 1).unwrap();
        c.record_tree(2, 7, 2).unwrap();
        c.tree_draft_tokens = u64::MAX - 5;
        let s = Snapshot {
            counters: c,
            at_ns: u64::MAX - 3,
            readback_errors: 9,
        };
        assert_eq!(Snapshot::load(&s.to_storage()), s);
    }
}
