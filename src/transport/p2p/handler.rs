//! The P2P proxy's trigger handler: Data is a copy from our buffer into the peer's (mapped with CUDA IPC);
//! Flag is an 8-byte copy of the number of flags carried out on the connection (`flag_counts`; the legacy
//! proxy copied our `device` epoch, which may run ahead of the data) into the peer's `proxy` epoch on the
//! same stream, so it lands after the data of the triggers before it; Sync waits for the stream to drain.
//!
//! A flag raised while none of our data is in flight is first stored, by the CPU, into the peer's fast
//! flag (host memory shared with the peer, read by the header's `wait()`): it arrives microseconds
//! before the copy engine's. With data in flight it cannot be: a CPU store would overtake the data, and
//! any GPU write into host memory after a copy (a stream write, a copy from host memory, or the wait
//! for the stream to drain) was measured slower than the copy engine's flag into device memory.

use super::flag_counts::FlagCountTable;
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext, Stream};
use crate::proxy::{Trigger, TriggerHandler};
use crate::transport::FlagsCarried;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the proxy needs of one connection; `None` in the plan for connections it does not serve.
#[derive(Clone, Copy, Debug)]
pub struct P2pRoute {
    pub local_buff: DevicePtr,
    pub local_size: u64,
    pub remote_buff: DevicePtr,
    pub remote_size: u64,
    /// Our `mscclppDevConnSignalEpochId` (its `device` word is the first).
    pub local_epochs: DevicePtr,
    /// The peer's `mscclppDevConnSignalEpochId` (its `proxy` word is at +8).
    pub remote_epochs: DevicePtr,
    /// The peer's fast flag, as our CPU reaches it (the transport keeps it mapped).
    pub fast_flag: Option<usize>,
}

/// Looks up the route of a trigger's connection.
pub fn route_of<'a>(routes: &'a [Option<P2pRoute>], t: &Trigger) -> Result<&'a P2pRoute> {
    routes.get(t.conn_id as usize).and_then(|r| r.as_ref()).ok_or_else(|| {
        Error::invalid_usage(format!(
            "connection id {} is not a P2P connection of this communicator",
            t.conn_id
        ))
    })
}

/// How the proxy raises a peer's flag in its epoch struct (`MSCCLPP_P2P_FLAG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagMode {
    /// Copy the number of flags this connection has carried out with the copy engine, from a table
    /// (`flag_counts`): exactly the signals whose data is ordered before it (`copy`).
    CopyCount,
    /// Copy our `device` epoch into the peer's `proxy` epoch with the copy engine (`epoch`, the legacy
    /// way). The value may count signals whose data is queued behind the flag (`flag_counts` says how
    /// that bites).
    CopyEpoch,
}

/// Tuning of the P2P proxy, from the environment (the defaults are the settings' table's):
/// - `MSCCLPP_P2P_FAST_FLAGS=1|0`: give P2P connections fast flags (see the module)
/// - `MSCCLPP_P2P_FLAG=copy|epoch`: `copy`, the exact count by the copy engine; `epoch`, the legacy copy of
///   the `device` epoch
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pOptions {
    pub fast_flags: bool,
    pub flag: FlagMode,
}

/// The settings' declared defaults.
impl Default for P2pOptions {
    fn default() -> Self {
        P2pOptions::parse(&crate::settings::Source::from_fn(|_| None))
    }
}

impl P2pOptions {
    pub fn from_env() -> P2pOptions {
        Self::parse(&crate::settings::Source::process())
    }

    /// Reads the options; bad values warn and keep the defaults (`settings`).
    pub fn parse(env: &crate::settings::Source) -> P2pOptions {
        use crate::settings::{P2P_FAST_FLAGS, P2P_FLAG};
        P2pOptions {
            fast_flags: env.flag(&P2P_FAST_FLAGS),
            flag: match env.choice(&P2P_FLAG) {
                "epoch" => FlagMode::CopyEpoch,
                _ => FlagMode::CopyCount,
            },
        }
    }
}

/// How long after queuing data the proxy first asks whether it has landed.
const QUERY_AFTER: Duration = Duration::from_micros(20);

pub struct P2pHandler {
    routes: Vec<Option<P2pRoute>>,
    /// Per connection (`FlagMode::CopyCount`): where the copy engine finds each flag's value.
    counts: Vec<Option<FlagCountTable>>,
    options: P2pOptions,
    /// The copy stream: data and flags, in trigger order.
    stream: Stream,
    /// Data was queued since the stream was last seen idle: a fast flag now could overtake it.
    data_in_flight: bool,
    /// When the last data was queued.
    data_queued_at: Instant,
    /// Flags carried out per connection; kept by the communicator across launches.
    flags: FlagsCarried,
    /// Flags to peers with a fast flag: (stored at once, left to the copy engine); kept only when they
    /// will be reported.
    stats: Option<(u64, u64)>,
}

impl P2pHandler {
    pub fn new(
        ctx: &GpuContext,
        routes: Vec<Option<P2pRoute>>,
        options: P2pOptions,
        flags: FlagsCarried,
    ) -> Result<P2pHandler> {
        let counts = routes
            .iter()
            .enumerate()
            .map(|(conn_id, route)| match (route, options.flag) {
                (Some(_), FlagMode::CopyCount) => FlagCountTable::new(ctx, flags.count(conn_id)).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(P2pHandler {
            routes,
            counts,
            options,
            stream: Stream::new(ctx)?,
            data_in_flight: false,
            data_queued_at: Instant::now(),
            flags,
            stats: log::log_enabled!(log::Level::Info).then_some((0, 0)),
        })
    }

    /// Queues the data of a trigger whose ranges `handle` checked against the route's buffers.
    fn copy_data(&mut self, route: &P2pRoute, t: &Trigger) -> Result<()> {
        self.data_in_flight = true;
        self.data_queued_at = Instant::now();
        let (dst, src) = (
            route.remote_buff + t.dst_offset as u64,
            route.local_buff + t.src_offset as u64,
        );
        // SAFETY: both ranges lie inside the connection's buffers (`Trigger::check_ranges`, called by
        // `handle` before this); our buffer is the application's, kept while the proxy runs, and the
        // peer's is mapped by the transport until it is cleared, after the proxy has stopped.
        unsafe { self.stream.copy(dst, src, t.data_size as usize) }
    }

    /// Whether all data queued so far has landed. The stream is asked only once the data has had
    /// `QUERY_AFTER` to land: a stream was measured to report a 1 KiB copy done ~14 us after it was
    /// queued (in a loop whose stream carried a backlog), and asking sooner only costs (a proxy that
    /// queried on every flag made the 1 MiB bidirectional benchmark slower).
    fn data_landed(&mut self) -> Result<bool> {
        if self.data_in_flight && self.data_queued_at.elapsed() >= QUERY_AFTER {
            self.data_in_flight = !self.stream.is_idle()?;
        }
        Ok(!self.data_in_flight)
    }

    fn raise_flag(&mut self, route: &P2pRoute, conn_id: usize) -> Result<()> {
        let count = self.flags.carry_one(conn_id)?;
        if let Some(fast) = route.fast_flag {
            let landed = self.data_landed()?;
            if landed {
                store_flag(fast, count);
            }
            if let Some((stored, left)) = self.stats.as_mut() {
                *if landed { stored } else { left } += 1;
            }
        }
        // The flag goes on the copy stream, after the data of the triggers before it.
        let word = route.remote_epochs + 8;
        match self.options.flag {
            FlagMode::CopyCount => {
                let counts = self
                    .counts
                    .get_mut(conn_id)
                    .and_then(Option::as_mut)
                    .ok_or_else(|| Error::internal(format!("connection {conn_id} has no flag count table")))?;
                let src = counts.source(&self.stream, count)?;
                // SAFETY: `src` is a word of the flag count table, which lives as long as this handler
                // and its stream; `word` is the peer's `proxy` word, in its epoch block, mapped until the
                // transport is cleared (after the proxy has stopped), and written only by this proxy.
                unsafe { self.stream.copy(word, src, 8) }
            }
            // SAFETY: our epoch block lives until the connection goes, after the proxy has stopped; the
            // peer's word as above.
            FlagMode::CopyEpoch => unsafe { self.stream.copy(word, route.local_epochs, 8) },
        }
    }
}

impl Drop for P2pHandler {
    fn drop(&mut self) {
        if let Some((stored, left)) = self.stats
            && stored + left > 0
        {
            log::info!("P2P fast flags: {stored} stored at once, {left} left to the copy engine (data in flight)");
        }
    }
}

/// Stores a flag count into a peer's fast flag.
fn store_flag(fast: usize, count: u64) {
    // SAFETY: `fast` is an aligned word of shared host memory that the communicator keeps mapped while
    // its proxy runs (checked to lie inside the object at set-up); the peer's GPU only reads it, and only
    // this proxy writes it.
    let w = unsafe { AtomicU64::from_ptr(fast as *mut u64) };
    w.store(count, Ordering::Release);
}

/// What the P2P proxy does with a trigger on `route` (`copy` and `raise_flag` are the handler's; apart so
/// that tests check the rule without a GPU): `transport::carry_out` with the trigger's ranges checked
/// against both buffers of the route.
fn carry_out_on<H: ?Sized>(
    handler: &mut H,
    route: &P2pRoute,
    t: &Trigger,
    copy: impl FnOnce(&mut H) -> Result<()>,
    raise_flag: impl FnOnce(&mut H) -> Result<()>,
) -> Result<()> {
    crate::transport::carry_out(
        handler,
        t,
        || t.check_ranges(route.local_size, route.remote_size),
        copy,
        raise_flag,
    )
}

impl TriggerHandler for P2pHandler {
    fn handle(&mut self, t: &Trigger) -> Result<()> {
        let route = *route_of(&self.routes, t)?;
        carry_out_on(
            self,
            &route,
            t,
            |h| h.copy_data(&route, t),
            |h| h.raise_flag(&route, t.conn_id as usize),
        )
    }

    fn sync(&mut self) -> Result<()> {
        self.stream.spin_until_idle()?;
        self.data_in_flight = false;
        Ok(())
    }

    /// Raises the epochs our kernels wait on (the peer will not raise them any more).
    fn abort(&mut self) -> Result<()> {
        let blocks = self.routes.iter().flatten().map(|r| r.local_epochs);
        // SAFETY: `local_epochs` are our connections' epoch blocks, which the communicator frees only after
        // this proxy is stopped (and the stream idle).
        unsafe { crate::transport::release_waits(&self.stream, blocks) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> P2pRoute {
        P2pRoute {
            local_buff: 0x1000,
            local_size: 100,
            remote_buff: 0x9000,
            remote_size: 50,
            local_epochs: 0,
            remote_epochs: 0,
            fast_flag: None,
        }
    }

    #[test]
    fn ranges_are_checked_against_both_buffers() {
        let t = |src, dst, size| Trigger {
            data_size: size,
            src_offset: src,
            dst_offset: dst,
            conn_id: 0,
            kind: 1,
        };
        assert!(
            t(0, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .is_ok()
        );
        assert!(
            t(50, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .is_ok()
        );
        assert!(
            t(51, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .unwrap_err()
                .message
                .contains("local buffer")
        );
        assert!(
            t(0, 1, 50)
                .check_ranges(route().local_size, route().remote_size)
                .unwrap_err()
                .message
                .contains("peer's buffer")
        );
        assert!(
            t(u32::MAX, 0, u32::MAX)
                .check_ranges(route().local_size, route().remote_size)
                .is_err(),
            "no overflow"
        );
    }

    /// What `carry_out_on` did with a trigger: (copied, flags raised), or its error.
    fn carried(t: Trigger) -> Result<(bool, u32)> {
        fn copy(done: &mut (bool, u32)) -> Result<()> {
            done.0 = true;
            Ok(())
        }
        fn raise_flag(done: &mut (bool, u32)) -> Result<()> {
            done.1 += 1;
            Ok(())
        }
        let mut done = (false, 0);
        carry_out_on(&mut done, &route(), &t, copy, raise_flag)?;
        Ok(done)
    }

    #[test]
    fn a_data_part_of_size_0_is_ignored_whatever_its_offsets() {
        use crate::proxy::trigger::{TYPE_DATA, TYPE_FLAG};
        let t = |kind, size, src, dst| Trigger {
            data_size: size,
            src_offset: src,
            dst_offset: dst,
            conn_id: 0,
            kind,
        };
        // Offsets far past both buffers (100 and 50 bytes): nothing to copy, nothing checked or dropped.
        assert_eq!(carried(t(TYPE_DATA, 0, 1000, 2000)).unwrap(), (false, 0));
        assert_eq!(
            carried(t(TYPE_DATA | TYPE_FLAG, 0, 1000, 2000)).unwrap(),
            (false, 1),
            "its flag is raised"
        );
        // One byte past a buffer is still a malformed trigger: its data is dropped (InvalidUsage).
        let e = carried(t(TYPE_DATA, 1, 100, 0)).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert_eq!(carried(t(TYPE_DATA, 50, 50, 0)).unwrap(), (true, 0));
    }

    #[test]
    fn unknown_connections_are_rejected() {
        let routes = vec![Some(route()), None];
        let t = |c| Trigger {
            data_size: 1,
            src_offset: 0,
            dst_offset: 0,
            conn_id: c,
            kind: 2,
        };
        assert!(route_of(&routes, &t(0)).is_ok());
        assert!(route_of(&routes, &t(1)).is_err());
        assert!(route_of(&routes, &t(1023)).is_err());
    }

    #[test]
    fn options_parse_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let env = |pairs| crate::settings::Source::from_fn(env(pairs));
        let defaults = P2pOptions {
            fast_flags: true,
            flag: FlagMode::CopyCount,
        };
        assert_eq!(P2pOptions::parse(&env(&[])), defaults);
        assert_eq!(P2pOptions::default(), defaults);
        let o = P2pOptions::parse(&env(&[("MSCCLPP_P2P_FAST_FLAGS", "0"), ("MSCCLPP_P2P_FLAG", "epoch")]));
        assert_eq!(
            o,
            P2pOptions {
                fast_flags: false,
                flag: FlagMode::CopyEpoch,
            }
        );
        let o = P2pOptions::parse(&env(&[("MSCCLPP_P2P_FLAG", "x"), ("MSCCLPP_P2P_FAST_FLAGS", "yes")]));
        assert_eq!(o, P2pOptions::default(), "bad values keep the defaults");
        let o = P2pOptions::parse(&env(&[("MSCCLPP_P2P_FLAG", "write")]));
        assert_eq!(
            o.flag,
            FlagMode::CopyCount,
            "the removed stream-write flag is a bad value now"
        );
        assert_eq!(P2pOptions::default().flag, FlagMode::CopyCount);
        let o = P2pOptions::parse(&env(&[("MSCCLPP_P2P_FLAG", "epoch")]));
        assert_eq!(o.flag, FlagMode::CopyEpoch);
    }

    #[test]
    fn a_fast_flag_is_a_plain_store() {
        let mut word = 0u64;
        store_flag(&mut word as *mut u64 as usize, 7);
        assert_eq!(word, 7);
    }
}
