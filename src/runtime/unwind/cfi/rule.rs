//! [`Rule`]: what the walk does at one code address, and its packing into one cache word.

/// DWARF register numbers (x86_64 psABI).
pub(crate) const RBP: u64 = 6;
pub(crate) const RSP: u64 = 7;

/// What the walk does at one code address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// A frame: CFA = (`rbp` if `cfa_in_rbp` else `rsp`) + `cfa_offset`; the return address
    /// at CFA − 8; the caller's `rbp` at CFA + `rbp_offset` when saved, else unchanged.
    Step { cfa_in_rbp: bool, cfa_offset: i32, rbp_offset: Option<i16> },
    /// The outermost frame (its return address is undefined).
    End,
    /// A rule the walk cannot follow, well formed but beyond what it follows (a signal frame,
    /// the CFA in another register or given by an expression): the stack ends at this frame,
    /// as libgcc's unwinder, were the stack handed to it, would trust every table further up.
    Unsupported,
    /// Code without unwind tables, or tables the walk rejects as malformed: the stack ends at
    /// this frame. libgcc's unwinder, which trusts the tables, could fault on them, and reads
    /// the code at an address without tables (looking for a signal trampoline), which after
    /// a corrupt frame may be any address.
    Rejected,
}

impl Rule {
    const END: u64 = 1 << 62;
    const UNSUPPORTED: u64 = 2 << 62;
    const REJECTED: u64 = 3 << 62;
    const CFA_IN_RBP: u64 = 1 << 48;
    const RBP_SAVED: u64 = 1 << 49;

    /// The rule as one nonzero word (a cache slot's value).
    pub(crate) fn pack(self) -> u64 {
        match self {
            Rule::End => Rule::END,
            Rule::Unsupported => Rule::UNSUPPORTED,
            Rule::Rejected => Rule::REJECTED,
            Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset } => {
                let mut word = cfa_offset as u32 as u64 | (rbp_offset.unwrap_or(0) as u16 as u64) << 32;
                if cfa_in_rbp {
                    word |= Rule::CFA_IN_RBP;
                }
                if rbp_offset.is_some() {
                    word |= Rule::RBP_SAVED;
                }
                // A step is never the zero word: its flags or its CFA offset (≥ 8) are set.
                word
            }
        }
    }

    pub(crate) fn unpack(word: u64) -> Rule {
        match word & (3 << 62) {
            Rule::END => Rule::End,
            Rule::UNSUPPORTED => Rule::Unsupported,
            Rule::REJECTED => Rule::Rejected,
            _ => Rule::Step {
                cfa_in_rbp: word & Rule::CFA_IN_RBP != 0,
                cfa_offset: word as u32 as i32,
                rbp_offset: (word & Rule::RBP_SAVED != 0).then_some((word >> 32) as u16 as i16),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pack_into_one_nonzero_word() {
        let rules = [
            Rule::End,
            Rule::Unsupported,
            Rule::Rejected,
            Rule::Step { cfa_in_rbp: false, cfa_offset: 8, rbp_offset: None },
            Rule::Step { cfa_in_rbp: true, cfa_offset: 16, rbp_offset: Some(-16) },
            Rule::Step { cfa_in_rbp: false, cfa_offset: 1 << 20, rbp_offset: Some(-4096) },
        ];
        for rule in rules {
            assert_ne!(rule.pack(), 0);
            assert_eq!(Rule::unpack(rule.pack()), rule);
        }
    }
}
