//! Guest RX: [`DataPath::send`] writes a batch's frames into the guest's receive chains (see
//! the parent module's doc, "Guest RX").

use super::*;

impl DataPath {
    /// Writes the frames of `batch` at `indices` to the guest on the RX queue of `pair` (of
    /// pair 0 when the guest has not enabled `pair`; see the module doc); returns how many
    /// were written, the first ones of `indices`.
    pub(crate) fn send(
        &mut self,
        cx: &Ctx<'_>,
        pair: usize,
        batch: &Batch,
        indices: &[u8],
        io: &mut PortIoCounters,
    ) -> usize {
        debug_assert!(self.log_cache.is_empty(), "marks left from a batch");
        let (shared, mem, health, features) = (cx.shared, cx.mem, cx.health, cx.features);
        let c = &shared.counters;
        let (st, pair) = if health.is_quarantined() {
            (None, 0)
        } else {
            match live_vring(cx.vrings, rx_queue(pair)) {
                Some(st) => (Some(st), pair),
                None => (live_vring(cx.vrings, RX_QUEUE), 0),
            }
        };
        let Some(mut st) = st else {
            bump(&c.disconnected_frames, indices.len() as u64);
            io.tx_errors += indices.len() as u64;
            return 0;
        };
        let hdr_len = guest_hdr_len(features);
        let mergeable = features & F_MRG_RXBUF != 0;
        let q = st.get_queue_mut();
        let event_idx = q.event_idx_enabled();
        let mut view = GuestView::new(mem);
        let resolved = open_ring(&mut view, q);
        let (ring, mut left) = match resolved {
            Ok(rp) => rp,
            Err(e) => {
                e.count(c);
                shared.quarantine(health);
                bump(&c.disconnected_frames, indices.len() as u64);
                io.tx_errors += indices.len() as u64;
                return 0;
            }
        };
        if !event_idx && !ring.kicks_off() {
            let _ = q.disable_notification(mem);
        }
        let first_used = q.next_used();
        let mut pos = q.next_avail();
        let (mut sent, mut bytes, mut used) = (0usize, 0u64, 0u16);
        let mut shortage = None;
        'frames: for &i in indices {
            let frame = batch.frame(usize::from(i));
            if frame.len() < VNET_HDR_LEN || !guest_accepts(features, &VnetHdr::parse(frame)) {
                break;
            }
            let need = (hdr_len + frame.len() - VNET_HDR_LEN) as u64;
            self.chains.clear();
            self.rx_segs.clear();
            let mut start = pos;
            let mut cap = 0u64;
            while cap < need {
                if (!mergeable && !self.chains.is_empty()) || self.rx_segs.len() > MAX_FRAME_SEGS {
                    shortage = Some(RxShortage::TooSmall);
                } else if left == 0 {
                    shortage = Some(RxShortage::NoBuffers);
                }
                if shortage.is_some() {
                    pos = start;
                    break 'frames;
                }
                let head = match ring.head(pos) {
                    Ok(h) => h,
                    Err(e) => {
                        e.count(c);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                };
                pos = pos.wrapping_add(1);
                left -= 1;
                let first = self.rx_segs.len();
                let segs = &mut self.rx_segs;
                // A segment is part of one descriptor's buffer: its length fits in u32.
                let walked = walk(&ring, &mut view, head, true, u64::MAX, |_, addr, s| {
                    segs.push(Segment {
                        addr,
                        len: s.len() as u32,
                    });
                    true
                });
                match walked {
                    Ok(len) => {
                        self.chains.push(RxChain {
                            head,
                            first,
                            count: self.rx_segs.len() - first,
                        });
                        cap += len;
                    }
                    Err(e) => {
                        // Give back this chain and those gathered so far for the frame
                        // (empty), and start gathering again after it: the used entries of
                        // one frame stay consecutive and nothing needs rewinding.
                        e.count(c);
                        shared.bad_chain(health);
                        let heads = self.chains.iter().map(|ch| ch.head);
                        for h in heads.chain((head < ring.size).then_some(head)) {
                            if let Err(e) = ring.put_used(first_used.wrapping_add(used), h, 0) {
                                e.count(c);
                                shortage = Some(RxShortage::Ring);
                                break 'frames;
                            }
                            used += 1;
                        }
                        if health.is_quarantined() {
                            shortage = Some(RxShortage::Ring);
                            break 'frames;
                        }
                        self.chains.clear();
                        self.rx_segs.clear();
                        cap = 0;
                        start = pos;
                    }
                }
            }
            // The header as the guest gets it: `num_buffers` set, legacy guests get 10 bytes
            // (`GuestStream`).
            let buffers = if mergeable {
                self.chains.len() as u16
            } else {
                1
            };
            let stream = GuestStream {
                frame,
                hdr_len,
                num_buffers: buffers,
            };
            let mut off = 0usize;
            let total = need as usize;
            for ch in &self.chains {
                let start_off = off;
                for seg in &self.rx_segs[ch.first..ch.first + ch.count] {
                    if off == total {
                        break;
                    }
                    let n = (seg.len as usize).min(total - off);
                    // Resolved by the walk in this burst's memory map (the view's cached
                    // region): it cannot fail, but a failure is a broken ring, not a panic.
                    let written = view
                        .slice(seg.addr, n)
                        .is_some_and(|d| stream.write(&d, off));
                    if let Some(log) = cx.log.filter(|_| written) {
                        self.log_cache.mark(log, seg.addr, n as u64);
                    }
                    if !written {
                        bump(&c.bad_desc_address, 1);
                        shortage = Some(RxShortage::Ring);
                        break 'frames;
                    }
                    off += n;
                }
                let written = u32::try_from(off - start_off).unwrap_or(u32::MAX);
                if let Err(e) = ring.put_used(first_used.wrapping_add(used), ch.head, written) {
                    e.count(c);
                    shortage = Some(RxShortage::Ring);
                    break 'frames;
                }
                used += 1;
            }
            sent += 1;
            bytes += frame.len() as u64;
        }
        q.set_next_avail(pos);
        // The buffers' marks reach the log before the guest can see the buffers filled.
        if let Some(log) = cx.log {
            self.log_cache.flush(log);
        }
        let next_used = first_used.wrapping_add(used);
        let published = publish(&ring, q, next_used, used).unwrap_or_else(|e| {
            // Nothing written this burst reaches the guest.
            e.count(c);
            shortage = Some(RxShortage::Ring);
            sent = 0;
            bytes = 0;
            false
        });
        let lost = (indices.len() - sent) as u64;
        match shortage {
            Some(RxShortage::NoBuffers) => bump(&c.guest_rx_no_buffers_frames, lost),
            Some(RxShortage::TooSmall) => bump(&c.guest_rx_buffer_too_small_frames, lost),
            Some(RxShortage::Ring) => {
                shared.quarantine(health);
                bump(&c.disconnected_frames, lost);
            }
            // An offload the guest cannot take: the rest of the batch is lost with that frame
            // (the trait's "exactly the first n written").
            None => bump(&c.guest_offload_unsupported_frames, lost),
        }
        log_used_ring(cx.log, &mut self.log_cache, q);
        if published {
            interrupt(&ring, &st, event_idx, first_used, next_used, c);
        }
        io.tx_frames += sent as u64;
        io.tx_bytes += bytes;
        io.tx_errors += lost;
        if let Some(f) = shared.pair_frames.get(pair) {
            bump(&f[1], sent as u64);
        }
        bump(&shared.io[2], sent as u64);
        bump(&shared.io[3], bytes);
        sent
    }
}

/// A frame as the guest receives it: its virtio-net header cut to the guest's `hdr_len`
/// bytes, with `num_buffers` set when the header has it (12 bytes), then its payload.
///
/// Written straight from the batch's frame, the header's `num_buffers` patched in guest
/// memory afterwards, never staged in a stack copy: a 12-byte header built on the stack and
/// then copied out is read back by `memcpy` with loads wider than the stores that built it,
/// and such a load waits for every older store to reach the cache, here the burst's stores
/// into the guest's lines (17 % of the loop's cycles at 64 bytes, docs/dataplane.md).
struct GuestStream<'f> {
    /// The frame, with the data plane's 12-byte header.
    frame: &'f [u8],
    /// Header bytes on the guest's side (10 or 12).
    hdr_len: usize,
    /// `num_buffers` for a 12-byte header.
    num_buffers: u16,
}

impl GuestStream<'_> {
    /// Bytes of the stream.
    fn len(&self) -> usize {
        self.frame.len() - (VNET_HDR_LEN - self.hdr_len)
    }

    /// Writes the stream's bytes `from..from + dst.len()` into `dst`.
    #[inline]
    fn write(&self, dst: &Slice<'_>, from: usize) -> bool {
        let end = from + dst.len();
        if end > self.len() {
            return false;
        }
        let widen = VNET_HDR_LEN - self.hdr_len;
        let copy = |at: usize, src: &[u8]| {
            src.is_empty()
                || dst
                    .subslice(at, src.len())
                    .map(|d| d.copy_from(src))
                    .is_ok()
        };
        let copied = if widen == 0 {
            copy(0, &self.frame[from..end])
        } else {
            // A legacy header: the frame's first `hdr_len` bytes, then its payload.
            let split = end.min(self.hdr_len).max(from);
            copy(0, &self.frame[from..split])
                && copy(split - from, &self.frame[split + widen..end + widen])
        };
        if !copied || widen != 0 {
            return copied;
        }
        // `num_buffers`, bytes 10..12 of the header, where they fall in this piece.
        let nb = self.num_buffers.to_le_bytes();
        let (lo, hi) = (from.max(10), end.min(VNET_HDR_LEN));
        lo >= hi || copy(lo - from, &nb[lo - 10..hi - 10])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream as the guest must see it, built byte by byte.
    fn reference(frame: &[u8], hdr_len: usize, num_buffers: u16) -> Vec<u8> {
        let mut hdr = frame[..VNET_HDR_LEN].to_vec();
        hdr[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        hdr.truncate(hdr_len);
        hdr.extend_from_slice(&frame[VNET_HDR_LEN..]);
        hdr
    }

    #[test]
    fn a_stream_written_in_any_pieces_is_the_header_cut_and_patched_then_the_payload() {
        // Every byte of the frame distinct from `num_buffers`' bytes, so a patch in the wrong
        // place or a missing one shows.
        let frame: Vec<u8> = (0..80u8).map(|b| b.wrapping_mul(7) | 0x80).collect();
        for hdr_len in [10, VNET_HDR_LEN] {
            let want = reference(&frame, hdr_len, 0x0305);
            let stream = GuestStream {
                frame: &frame,
                hdr_len,
                num_buffers: 0x0305,
            };
            assert_eq!(stream.len(), want.len());
            // Pieces of every size from 1 to 13 bytes (each header boundary cut every way),
            // then the rest in one.
            for piece in 1..=13 {
                let mut got = vec![0u8; want.len()];
                let mut from = 0;
                while from < got.len() {
                    let n = if from < 24 { piece } else { got.len() - from }.min(got.len() - from);
                    let dst = Slice::from(&mut got[from..from + n]);
                    assert!(
                        stream.write(&dst, from),
                        "hdr {hdr_len}, piece {piece}, at {from}"
                    );
                    from += n;
                }
                assert_eq!(got, want, "hdr {hdr_len}, pieces of {piece}");
            }
            // A piece past the stream's end is refused, nothing written.
            let mut over = vec![0u8; 4];
            assert!(!stream.write(&Slice::from(&mut over[..]), want.len() - 2));
            assert_eq!(over, [0; 4]);
        }
    }
}
