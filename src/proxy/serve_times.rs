//! How long the proxy takes to serve each kind of trigger, and the CPU its thread used: reported at INFO
//! when the proxy stops.

use super::Trigger;

/// How long the proxy took to serve each trigger (from seeing it to releasing its slot), by kind: the
/// CPU cost of issuing the transport's work, which lies on the path of every signal.
#[derive(Default)]
pub struct ServeTimes {
    /// Per class (see `class_of`): count, total, max.
    classes: [(u64, std::time::Duration, std::time::Duration); 5],
}

impl ServeTimes {
    const NAMES: [&'static str; 5] = [
        "flag only",
        "data <= 64 KiB",
        "data <= 4 MiB",
        "data > 4 MiB",
        "with sync",
    ];

    fn class_of(t: &Trigger) -> usize {
        if t.has_sync() {
            4
        } else if !t.has_data() {
            0
        } else if t.data_size <= 64 << 10 {
            1
        } else if t.data_size <= 4 << 20 {
            2
        } else {
            3
        }
    }

    pub(super) fn add(&mut self, t: &Trigger, d: std::time::Duration) {
        let c = &mut self.classes[Self::class_of(t)];
        c.0 += 1;
        c.1 += d;
        c.2 = c.2.max(d);
    }

    pub(super) fn summary(&self) -> String {
        let parts: Vec<String> = self
            .classes
            .iter()
            .zip(Self::NAMES)
            .filter(|((n, _, _), _)| *n > 0)
            .map(|((n, total, max), name)| {
                format!(
                    "{name}: {n} x {:.2} us (max {:.1})",
                    total.as_secs_f64() * 1e6 / *n as f64,
                    max.as_secs_f64() * 1e6
                )
            })
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!("; time to serve a trigger: {}", parts.join(", "))
        }
    }
}

/// CPU time the calling thread has used (the proxy polls, so this shows what the polling costs).
pub(super) fn thread_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is valid, and getrusage fills it.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::trigger;

    #[test]
    fn serve_times_summarise_each_kind() {
        let mut st = ServeTimes::default();
        assert_eq!(st.summary(), "", "nothing to say before the first trigger");
        let t = |kind, data_size| Trigger {
            data_size,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 0,
            kind,
        };
        let us = std::time::Duration::from_micros;
        st.add(&t(trigger::TYPE_FLAG, 1), us(1));
        st.add(&t(trigger::TYPE_FLAG, 1), us(3));
        st.add(&t(trigger::TYPE_DATA | trigger::TYPE_FLAG, 1 << 20), us(5));
        st.add(&t(trigger::TYPE_SYNC, 1), us(7));
        assert_eq!(
            st.summary(),
            "; time to serve a trigger: flag only: 2 x 2.00 us (max 3.0), data <= 4 MiB: 1 x 5.00 us (max 5.0), \
             with sync: 1 x 7.00 us (max 7.0)"
        );
    }
}
