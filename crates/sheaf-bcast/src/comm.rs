//! The collective operations a broadcast needs, and who is on which node.
//!
//! [`Comm`] is the whole interface to the launcher's world: a handful of
//! collectives every rank calls in the same order. [`Solo`] is the world of
//! one process (a plain verified copy); `crate::mpi::Mpi` is the real one.
//! Nothing else in the crate knows MPI exists.

/// Collectives over all ranks. Every rank must make the same calls in the
/// same order with the same lengths (as in MPI).
pub trait Comm {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Fill `buf` on every rank with `root`'s `buf` (same length everywhere).
    fn bcast_into(&self, root: usize, buf: &mut [u8]);
    /// Bitwise OR of `buf` over all ranks, in place.
    fn all_or(&self, buf: &mut [u8]);
    /// Maximum of `x` over all ranks.
    fn all_max(&self, x: u64) -> u64;
    /// Minimum of `x` over all ranks.
    fn all_min(&self, x: u64) -> u64;
    /// Sum of `x` over all ranks.
    fn all_sum(&self, x: u64) -> u64;
    /// Every rank's `mine`, in rank order.
    fn all_gather(&self, mine: &[u8; NAME_LEN]) -> Vec<[u8; NAME_LEN]>;

    /// Broadcast a byte vector of any length from `root`.
    fn bcast_vec(&self, root: usize, v: &mut Vec<u8>) {
        let mut n = (v.len() as u64).to_le_bytes();
        self.bcast_into(root, &mut n);
        v.resize(u64::from_le_bytes(n) as usize, 0);
        self.bcast_into(root, v);
    }

    /// Agree on an outcome: `Ok` on every rank only if it is `Ok` on every
    /// rank; otherwise every rank gets one message, so all print the same
    /// line: that of the failing rank with the lowest `(priority, rank)`.
    fn agree(&self, local: Result<(), (u64, String)>) -> Result<(), String> {
        let failed = self.all_max(local.is_err() as u64);
        if failed == 0 {
            return Ok(());
        }
        let key = match &local {
            Err((prio, _)) => (prio << 32) | self.rank() as u64,
            Ok(()) => u64::MAX,
        };
        let first = (self.all_min(key) & 0xffff_ffff) as usize;
        let mut msg = local.err().map(|e| e.1).unwrap_or_default().into_bytes();
        self.bcast_vec(first, &mut msg);
        Err(String::from_utf8_lossy(&msg).into_owned())
    }
}

/// Bytes of a host name exchanged between ranks (longer names are cut; the
/// kernel's limit is 64).
pub const NAME_LEN: usize = 64;

/// The world of one process.
#[derive(Debug, Default)]
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn bcast_into(&self, _root: usize, _buf: &mut [u8]) {}
    fn all_or(&self, _buf: &mut [u8]) {}
    fn all_max(&self, x: u64) -> u64 {
        x
    }
    fn all_min(&self, x: u64) -> u64 {
        x
    }
    fn all_sum(&self, x: u64) -> u64 {
        x
    }
    fn all_gather(&self, mine: &[u8; NAME_LEN]) -> Vec<[u8; NAME_LEN]> {
        vec![*mine]
    }
}

/// Which ranks share a node: ranks whose host names are equal (what
/// `MPI_Get_processor_name` reports on Open MPI and MPICH). Host names, not
/// shared-memory domains, because a node is what has one local disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nodes {
    /// Node number of each rank (nodes numbered by their lowest rank).
    pub node_of: Vec<usize>,
    /// Lowest rank of each node: the one that writes the node's copy.
    pub leaders: Vec<usize>,
}

impl Nodes {
    /// Group ranks by the names they reported.
    pub fn from_names(names: &[[u8; NAME_LEN]]) -> Nodes {
        let mut leaders: Vec<usize> = Vec::new();
        let mut node_of = Vec::with_capacity(names.len());
        for (rank, n) in names.iter().enumerate() {
            match leaders.iter().position(|&l| names[l] == *n) {
                Some(i) => node_of.push(i),
                None => {
                    node_of.push(leaders.len());
                    leaders.push(rank);
                }
            }
        }
        Nodes { node_of, leaders }
    }

    /// Exchange host names over `comm` and group.
    pub fn discover(comm: &dyn Comm) -> Nodes {
        Nodes::from_names(&comm.all_gather(&host_name()))
    }

    /// Whether `rank` writes its node's copy.
    pub fn is_leader(&self, rank: usize) -> bool {
        self.leaders.get(self.node_of[rank]) == Some(&rank)
    }
}

/// This machine's host name, zero-padded.
pub fn host_name() -> [u8; NAME_LEN] {
    let mut b = [0u8; NAME_LEN];
    // SAFETY: the buffer is NAME_LEN bytes; gethostname writes at most that.
    unsafe { libc::gethostname(b.as_mut_ptr().cast(), NAME_LEN) };
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> [u8; NAME_LEN] {
        let mut b = [0u8; NAME_LEN];
        b[..s.len()].copy_from_slice(s.as_bytes());
        b
    }

    #[test]
    fn ranks_are_grouped_by_host_name_with_the_lowest_rank_leading() {
        let n = Nodes::from_names(&[name("b"), name("a"), name("b"), name("a"), name("c")]);
        assert_eq!(n.node_of, vec![0, 1, 0, 1, 2]);
        assert_eq!(n.leaders, vec![0, 1, 4]);
        assert!(n.is_leader(1) && !n.is_leader(3) && n.is_leader(4));
    }

    #[test]
    fn a_solo_world_agrees_with_itself() {
        assert_eq!(Solo.agree(Ok(())), Ok(()));
        assert_eq!(
            Solo.agree(Err((1, "x: broken".into()))),
            Err("x: broken".into())
        );
    }
}
