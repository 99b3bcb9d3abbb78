//! [`Comm`] over MPI (rsmpi), when built with the `mpi` feature.
//!
//! Only the main thread calls MPI (`MPI_THREAD_FUNNELED`); reading and
//! writing threads never do.

use crate::comm::{Comm, NAME_LEN};
use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

/// The launcher's world.
pub struct Mpi {
    world: SimpleCommunicator,
    // Dropped last: finalizes MPI.
    _universe: mpi::environment::Universe,
}

impl Mpi {
    /// Initialise MPI (once per process). `None` if it was already
    /// initialised or the library refused.
    pub fn init() -> Option<Mpi> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)?;
        Some(Mpi {
            world: universe.world(),
            _universe: universe,
        })
    }
}

impl Comm for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn bcast_into(&self, root: usize, buf: &mut [u8]) {
        // MPI counts are i32: send in pieces under 1 GiB.
        for piece in buf.chunks_mut(1 << 30) {
            self.world
                .process_at_rank(root as i32)
                .broadcast_into(piece);
        }
    }
    fn all_or(&self, buf: &mut [u8]) {
        let mut out = vec![0u8; buf.len()];
        for (i, o) in buf.chunks(1 << 30).zip(out.chunks_mut(1 << 30)) {
            self.world
                .all_reduce_into(i, o, SystemOperation::bitwise_or());
        }
        buf.copy_from_slice(&out);
    }
    fn all_max(&self, x: u64) -> u64 {
        let mut o = 0u64;
        self.world
            .all_reduce_into(&x, &mut o, SystemOperation::max());
        o
    }
    fn all_min(&self, x: u64) -> u64 {
        let mut o = 0u64;
        self.world
            .all_reduce_into(&x, &mut o, SystemOperation::min());
        o
    }
    fn all_sum(&self, x: u64) -> u64 {
        let mut o = 0u64;
        self.world
            .all_reduce_into(&x, &mut o, SystemOperation::sum());
        o
    }
    fn all_gather(&self, mine: &[u8; NAME_LEN]) -> Vec<[u8; NAME_LEN]> {
        let mut out = vec![0u8; NAME_LEN * self.size()];
        self.world.all_gather_into(&mine[..], &mut out[..]);
        out.chunks(NAME_LEN)
            .map(|c| c.try_into().expect("NAME_LEN chunks"))
            .collect()
    }
}
