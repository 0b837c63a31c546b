//! [`NetHandler`]: the answers to the frontend's vhost-user messages, one per session.
//!
//! The `vhost` crate parses the messages (`BackendReqHandler`); this handler keeps the device
//! state: acknowledged features, the guest memory map, the vrings (two per queue pair) (`vhost-user-backend`'s
//! `VringRwLock`: a `virtio-queue` `Queue` with its kick and call eventfds and enable flag).
//! We do not use `vhost-user-backend`'s own daemon: it ends the session on the first message
//! the `vhost` crate refuses, and QEMU (7.2 measured) sends `SET_VRING_ENABLE` before
//! `SET_FEATURES` (and never again after it), which the `vhost` crate refuses ("inactive
//! feature"). Our request loop ([`super::session`]) peeks at such a message, lets the crate
//! refuse it, applies it to this handler all the same, and goes on. (DPDK's vhost library
//! accepts it too.)

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};
use vhost::VhostUserMemoryRegionBase;
use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap, GuestRegionMmap};

use super::backend::{is_guest_tx, lock, write, Shared};
use super::dirty::DirtyLog;
use super::features::{
    offered_features, offered_protocol_features, F_EVENT_IDX, F_PROTOCOL_FEATURES,
};
use super::kick::Rearm;

/// One region of the frontend's address space, to translate ring addresses.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    /// Frontend virtual address of the region.
    vmm_addr: u64,
    /// Bytes.
    size: u64,
    /// Guest-physical address of the region.
    gpa: u64,
}

/// The device state of one session.
pub(crate) struct NetHandler {
    /// State shared with the port.
    shared: Arc<Shared>,
    /// The session's guest memory (shared with the port's session).
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// `[rx0, tx0, rx1, tx1, ...]`, shared with the port's session.
    vrings: Vec<VringRwLock>,
    /// Tells the kick worker to re-read the kick eventfds.
    rearm: Rearm,
    /// `SET_OWNER` was received.
    owned: bool,
    /// Virtio features acknowledged by `SET_FEATURES`.
    acked_features: u64,
    /// The frontend's address space, from `SET_MEM_TABLE`.
    mappings: Vec<Mapping>,
}

/// A `ReqHandlerError` for a refused request.
fn refused(what: &'static str) -> Error {
    Error::ReqHandlerError(io::Error::new(io::ErrorKind::Unsupported, what))
}

impl NetHandler {
    /// A handler over the session's memory and vrings.
    pub(crate) fn new(
        shared: Arc<Shared>,
        mem: GuestMemoryAtomic<GuestMemoryMmap>,
        vrings: Vec<VringRwLock>,
        rearm: Rearm,
    ) -> NetHandler {
        NetHandler {
            shared,
            mem,
            vrings,
            rearm,
            owned: false,
            acked_features: 0,
            mappings: Vec::new(),
        }
    }

    /// Vring `index`; one the port did not offer (a guest asking for more queue pairs than
    /// `queues`) is refused, counted in `refused_messages`, and changes nothing.
    fn vring(&self, index: u32) -> Result<&VringRwLock> {
        let found = self.vrings.get(index as usize);
        if found.is_none() {
            super::counters::bump(&self.shared.counters.refused_messages, 1);
            let (n, q) = (self.vrings.len(), self.shared.config.queues);
            *lock(&self.shared.refusal) = Some(format!(
                "the guest named vring {index}, but the port offers {n} (queues = {q})"
            ));
        }
        found.ok_or(Error::InvalidParam)
    }

    /// Frontend virtual address → guest-physical address.
    fn to_gpa(&self, vmm_addr: u64) -> Result<u64> {
        self.mappings
            .iter()
            .find(|m| vmm_addr >= m.vmm_addr && vmm_addr - m.vmm_addr < m.size)
            .map(|m| vmm_addr - m.vmm_addr + m.gpa)
            .ok_or(Error::InvalidParam)
    }
}

impl VhostUserBackendReqHandlerMut for NetHandler {
    fn set_owner(&mut self) -> Result<()> {
        if self.owned {
            return Err(Error::InvalidOperation("already owned"));
        }
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.owned = false;
        self.acked_features = 0;
        self.shared.features.store(0, Ordering::Release);
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        for v in &self.vrings {
            v.set_enabled(false);
            v.set_queue_ready(false);
        }
        self.acked_features = 0;
        self.shared.features.store(0, Ordering::Release);
        self.rearm.signal();
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(offered_features(self.shared.config.queues))
    }

    /// QEMU sends `SET_FEATURES` once per queue pair (each pair is a vhost device of its
    /// own), always with the same bits: every call applies to every vring.
    fn set_features(&mut self, features: u64) -> Result<()> {
        if features & !offered_features(self.shared.config.queues) != 0 {
            return Err(Error::InvalidParam);
        }
        self.acked_features = features;
        for v in &self.vrings {
            v.set_queue_event_idx(features & F_EVENT_IDX != 0);
            // Without protocol features the rings are enabled from now on (the legacy rule);
            // with them, SET_VRING_ENABLE decides.
            if features & F_PROTOCOL_FEATURES == 0 {
                v.set_enabled(true);
            }
        }
        self.shared.features.store(features, Ordering::Release);
        self.rearm.signal();
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        if postcopy_listening.is_some() {
            return Err(refused("postcopy"));
        }
        let mut regions = Vec::with_capacity(ctx.len());
        let mut mappings = Vec::with_capacity(ctx.len());
        for (region, file) in ctx.iter().zip(files) {
            let mapped = region.mmap_region::<()>(file)?;
            let guest = GuestRegionMmap::new(mapped, GuestAddress(region.guest_phys_addr))
                .ok_or(Error::InvalidParam)?;
            regions.push(guest);
            mappings.push(Mapping {
                vmm_addr: region.user_addr,
                size: region.memory_size,
                gpa: region.guest_phys_addr,
            });
        }
        let mem = GuestMemoryMmap::from_regions(regions).map_err(|_| Error::InvalidParam)?;
        // The port loads the new map at its next batch; the old one is unmapped when the last
        // batch using it ends.
        self.mem
            .lock()
            .map_err(|_| Error::BackendInternalError)?
            .replace(mem);
        self.mappings = mappings;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        let max = u32::from(self.shared.config.max_queue_size);
        if num == 0 || num > max || !num.is_power_of_two() {
            return Err(Error::InvalidParam);
        }
        self.vring(index)?.set_queue_size(num as u16);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        let (d, u, a) = (
            self.to_gpa(descriptor)?,
            self.to_gpa(used)?,
            self.to_gpa(available)?,
        );
        let v = self.vring(index)?;
        v.set_queue_info(d, a, u).map_err(|_| Error::InvalidParam)?;
        // A restarted guest driver begins its used ring where it left it.
        if let Ok(idx) = v.queue_used_idx() {
            v.set_queue_next_used(idx);
        }
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        self.vring(index)?.set_queue_next_avail(base as u16);
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        // The frontend stops the ring: no batch uses it after this returns (the port checks
        // `ready` under the vring lock once per batch).
        let v = self.vring(index)?;
        v.set_queue_ready(false);
        let next = v.queue_next_avail();
        v.set_kick(None);
        v.set_call(None);
        self.rearm.signal();
        Ok(VhostUserVringState::new(index, u32::from(next)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let v = self.vring(u32::from(index))?;
        v.set_kick(fd);
        // A frontend that outlived its previous backend (our client mode after a restart of
        // vqosd; DPDK's virtio-user sends a base of 0 whatever its rings hold) has rings that
        // are far along: continue from where the used ring says the last backend finished, as
        // DPDK's vhost library does. Chains the old backend took but never completed are read
        // again (a frame may be sent twice, none is lost for good); without this the avail
        // index looks a ring ahead and the session is quarantined.
        if let Ok(used) = v.queue_used_idx() {
            if v.queue_next_avail() != used {
                v.set_queue_next_avail(used);
                v.set_queue_next_used(used);
            }
        }
        // The ring starts with its kick eventfd (vhost-user: "start ring upon receiving a
        // kick").
        v.set_queue_ready(true);
        self.rearm.signal();
        if is_guest_tx(usize::from(index)) {
            // Frames may already wait: let the loop look once.
            self.shared.ready.signal();
        }
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.vring(u32::from(index))?.set_call(fd);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.vring(u32::from(index))?.set_err(fd);
        Ok(())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(offered_protocol_features())
    }

    fn set_protocol_features(&mut self, _features: u64) -> Result<()> {
        // The `vhost` crate keeps what was acknowledged (REPLY_ACK is all we offer).
        Ok(())
    }

    /// Queue pairs, as QEMU's net device and DPDK's vhost library read it.
    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(u64::from(self.shared.config.queues))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        self.vring(index)?.set_enabled(enable);
        self.rearm.signal();
        if enable && is_guest_tx(index as usize) {
            self.shared.ready.signal();
        }
        Ok(())
    }

    fn get_config(&mut self, _: u32, _: u32, _: VhostUserConfigFlags) -> Result<Vec<u8>> {
        Err(refused("config space"))
    }

    fn set_config(&mut self, _: u32, _: &[u8], _: VhostUserConfigFlags) -> Result<()> {
        Err(refused("config space"))
    }

    fn set_gpu_socket(&mut self, _: GpuBackend) -> Result<()> {
        Err(refused("gpu socket"))
    }

    fn get_shared_object(&mut self, _: VhostUserSharedMsg) -> Result<File> {
        Err(refused("shared objects"))
    }

    fn get_inflight_fd(&mut self, _: &VhostUserInflight) -> Result<(VhostUserInflight, File)> {
        Err(refused("inflight tracking"))
    }

    fn set_inflight_fd(&mut self, _: &VhostUserInflight, _: File) -> Result<()> {
        Err(refused("inflight tracking"))
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        Err(refused("memory slots"))
    }

    fn add_mem_region(
        &mut self,
        _: &VhostUserSingleMemoryRegion,
        _: File,
        _: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        Err(refused("memory slots"))
    }

    fn remove_mem_region(&mut self, _: &VhostUserSingleMemoryRegion) -> Result<()> {
        Err(refused("memory slots"))
    }

    fn set_device_state_fd(
        &mut self,
        _: VhostTransferStateDirection,
        _: VhostTransferStatePhase,
        _: File,
    ) -> Result<Option<File>> {
        Err(refused("device state"))
    }

    fn check_device_state(&mut self) -> Result<()> {
        Err(refused("device state"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        Err(refused("shared memory"))
    }

    /// The dirty log of a live migration: mapped now, written while `LOG_ALL` is
    /// acknowledged ([`super::dirty`]); a new one replaces the old.
    /// Refused (`dirty_logs_refused`, the session ends with the reason as its last error)
    /// before any memory table (a log of no memory: QEMU always sends the table first), and
    /// for a log that is empty, larger than 256 MiB, or longer than its file.
    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> Result<()> {
        let map = if self.mappings.is_empty() {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "dirty log before the memory table",
            ))
        } else {
            DirtyLog::map(&file, log.mmap_size, log.mmap_offset)
        };
        // Counted by the session's loop, which also sees the `vhost` crate's own refusals.
        let map = map.map_err(Error::ReqHandlerError)?;
        *lock(&self.shared.log) = Some(Arc::new(map));
        // A batch under way may still hold the log this one replaces and mark it at its end;
        // QEMU syncs and frees that log as soon as this message is answered. Batches run
        // under the session's read lock: taking the write lock once waits for them, so the
        // answer follows the last mark in the old log.
        drop(write(&self.shared.session));
        super::counters::bump(&self.shared.counters.dirty_logs, 1);
        Ok(())
    }
}
