//! Where the proxy thread runs. It polls host memory that the GPU writes and issues work to the GPU, so
//! it belongs on the CPUs nearest the GPU: those of the GPU's NUMA node when the machine names one, or
//! the CPUs named by `MSCCLPP_PROXY_CPUS` (a kernel CPU list such as `0-7,16`), which take precedence.

use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// Binds the calling (proxy) thread. Best effort: GPUs that report no NUMA node (-1) are common, and
/// neither that nor a failed binding is an error.
pub fn bind_proxy_thread(ctx: &GpuContext) {
    match crate::settings::PROXY_CPUS.text() {
        Some(list) => {
            let cpus = parse_cpu_list(&list);
            if cpus.is_empty() {
                log::warn!("MSCCLPP_PROXY_CPUS={list:?} names no CPU; the proxy thread is not bound");
            } else {
                bind_to(&cpus, "MSCCLPP_PROXY_CPUS");
            }
        }
        None => match numa_cpus(ctx) {
            Ok(Some(cpus)) => bind_to(&cpus, "its GPU's NUMA node"),
            Ok(None) => log::info!(
                "GPU {} reports no NUMA node; the proxy thread is not bound (MSCCLPP_PROXY_CPUS can bind it)",
                ctx.device
            ),
            Err(e) => log::info!("NUMA binding skipped: {e}"),
        },
    }
}

fn bind_to(cpus: &[usize], what: &str) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for ids < CPU_SETSIZE.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(*c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        log::info!("proxy thread bound to CPUs {cpus:?} ({what})");
    } else {
        log::info!(
            "could not bind the proxy thread to the CPUs of {what}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn numa_cpus(ctx: &GpuContext) -> Result<Option<Vec<usize>>> {
    let bus = ctx.pci_bus_id()?;
    let node_path = format!("/sys/bus/pci/devices/{bus}/numa_node");
    let node: i64 = std::fs::read_to_string(&node_path)
        .map_err(|e| Error::io(&node_path, e))?
        .trim()
        .parse()
        .map_err(|_| Error::system(format!("{node_path} is not a number")))?;
    if node < 0 {
        return Ok(None);
    }
    let list_path = format!("/sys/devices/system/node/node{node}/cpulist");
    let list = std::fs::read_to_string(&list_path).map_err(|e| Error::io(&list_path, e))?;
    Ok(Some(parse_cpu_list(&list)))
}

/// Parses a kernel CPU list such as `0-3,8,10-11`; malformed parts are skipped.
pub fn parse_cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("5-2,x"), Vec::<usize>::new());
        assert_eq!(parse_cpu_list(" 4 , 6-7"), vec![4, 6, 7]);
    }
}
